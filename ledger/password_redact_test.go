package ledger_test

import (
	"context"
	"strings"
	"testing"

	"github.com/toolq/toolq/ledger"
)

// A database URL's passwords (its userinfo's; password= and sslpassword=
// in its query, which libpq and pgx take) are in none of the errors that
// name the URL.
func TestAPasswordInTheDatabaseURLIsNotInItsErrors(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	for _, u := range []string{
		"postgres://toolq@127.0.0.1:1/toolq?password=pw-QUERY-5ecret&pool_max_conns=many", // a setting pgx refuses
		"postgres://toolq@127.0.0.1:1/toolq?sslpassword=pw-QUERY-5ecret&sslmode=bogus",
		"postgres://toolq@127.0.0.1:1/toolq?PASSWORD=pw-QUERY-5ecret&pool_max_conns=many",
		"postgres://toolq@127.0.0.1:1/toolq?pass%77ord=pw-QUERY-5ecret&pool_max_conns=many",
		"postgres://toolq:pw-QUERY-5ecret@127.0.0.1:1/toolq?pool_max_conns=many",
		"postgres://toolq:pw-QUERY-5ecret@with@127.0.0.1:1/toolq?pool_max_conns=many",
		"postgresql+psycopg://toolq@db/toolq?password=pw-QUERY-5ecret", // a scheme toolq does not take
		"postgresql+psycopg://toolq:pw-QUERY-5ecret@db/toolq",
		"mysql://db/toolq?sslpassword=pw-QUERY-5ecret&password=pw-QUERY-5ecret",
		"host=db password=pw-QUERY-5ecret",
	} {
		_, err := ledger.Open(ctx, u, t.TempDir())
		if err == nil {
			t.Fatalf("%s opened", u)
		}
		if strings.Contains(err.Error(), "QUERY") || strings.Contains(err.Error(), "5ecret") {
			t.Errorf("%s: the error shows the password: %v", u, err)
		}
	}
}
