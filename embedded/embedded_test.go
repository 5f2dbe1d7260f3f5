package embedded_test

import (
	"context"
	"errors"
	"net"
	"os"
	"testing"

	"github.com/toolq/toolq/embedded"
)

// TestListenError: an address in use is a *ListenError naming the part, and
// what was started before it is stopped again.
func TestListenError(t *testing.T) {
	t.Parallel()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	for _, tc := range []struct {
		cfg  embedded.Config
		part embedded.Part
	}{
		{embedded.Config{NATSListen: l.Addr().String()}, embedded.PartNATS},
		{embedded.Config{SandboxListen: l.Addr().String()}, embedded.PartSandbox},
	} {
		st, err := embedded.Start(context.Background(), tc.cfg)
		var le *embedded.ListenError
		if st != nil || !errors.As(err, &le) || le.Part != tc.part || le.Addr != l.Addr().String() {
			t.Fatalf("%s: %v %v", tc.part, st, err)
		}
	}
}

// TestClose: Close is idempotent and removes the temporary directory.
func TestClose(t *testing.T) {
	t.Parallel()
	st, err := embedded.Start(context.Background(), embedded.Config{})
	if err != nil {
		t.Fatal(err)
	}
	st.Close()
	st.Close()
	if _, err := os.Stat(st.Dir); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("%s: %v", st.Dir, err)
	}
}
