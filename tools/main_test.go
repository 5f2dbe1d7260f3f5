package tools_test

import (
	"testing"

	"github.com/toolq/toolq/internal/testenv"
)

// TestMain stops the Postgres cluster the SQL executor's tests share.
func TestMain(m *testing.M) { testenv.Main(m) }
