package jcs_test

import (
	"errors"
	"fmt"

	"github.com/toolq/toolq/internal/jcs"
)

// Two spellings of the same arguments have one canonical form; a document
// that repeats a member name has none.
func ExampleCanonicalizeObject() {
	for _, doc := range []string{
		`{"currency": "EUR", "amount_cents": 1500.0}`,
		`{"amount_cents":15e2,"\u0063urrency":"EUR"}`,
		`{"amount_cents":1500,"amount_cents":1}`,
	} {
		canon, err := jcs.CanonicalizeObject([]byte(doc))
		if errors.Is(err, jcs.ErrDuplicateName) {
			fmt.Println("refused:", err)
			continue
		}
		fmt.Println(string(canon))
	}
	// Output:
	// {"amount_cents":1500,"currency":"EUR"}
	// {"amount_cents":1500,"currency":"EUR"}
	// refused: jcs: duplicate member name at offset 21: "amount_cents"
}
