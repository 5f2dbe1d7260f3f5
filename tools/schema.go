package tools

import (
	"bytes"
	"errors"
	"fmt"
	"strings"

	"github.com/santhosh-tekuri/jsonschema/v6"
)

// compileSchema compiles a tool's schema. References to other documents are
// refused: a registry is self-contained and loading it touches no network.
func compileSchema(tool string, doc []byte) (*jsonschema.Schema, error) {
	parsed, err := jsonschema.UnmarshalJSON(bytes.NewReader(doc))
	if err != nil {
		return nil, fmt.Errorf("not JSON: %v", err)
	}
	if _, ok := parsed.(map[string]any); !ok {
		return nil, errors.New("must be a JSON object")
	}
	c := jsonschema.NewCompiler()
	c.UseLoader(refuseLoader{})
	c.AssertFormat()
	url := "toolq:///tools/" + tool + ".json"
	if err := c.AddResource(url, parsed); err != nil {
		return nil, err
	}
	sch, err := c.Compile(url)
	if err != nil {
		return nil, errors.New(oneLine(err.Error()))
	}
	return sch, nil
}

type refuseLoader struct{}

func (refuseLoader) Load(url string) (any, error) {
	return nil, fmt.Errorf("external schema reference %s is not allowed", url)
}

// schemaReason flattens a validation error to one line: each failing
// location and why, the first few only.
func schemaReason(err error) string {
	var ve *jsonschema.ValidationError
	if !errors.As(err, &ve) {
		return oneLine(err.Error())
	}
	var reasons []string
	var walk func(u *jsonschema.OutputUnit)
	walk = func(u *jsonschema.OutputUnit) {
		if u.Error != nil {
			loc := u.InstanceLocation
			if loc == "" {
				loc = "/"
			}
			reasons = append(reasons, fmt.Sprintf("at %s: %s", loc, u.Error.String()))
		}
		for i := range u.Errors {
			walk(&u.Errors[i])
		}
	}
	walk(ve.BasicOutput())
	if len(reasons) == 0 {
		return oneLine(ve.Error())
	}
	if len(reasons) > 3 {
		reasons = append(reasons[:3], fmt.Sprintf("and %d more", len(reasons)-3))
	}
	return strings.Join(reasons, "; ")
}

func oneLine(s string) string {
	return strings.Join(strings.Fields(s), " ")
}
