package main

import (
	"context"
	"crypto/tls"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/toolq/toolq/approvals"
	"github.com/toolq/toolq/inbox"
	"github.com/toolq/toolq/internal/cli"
	"github.com/toolq/toolq/ledger"
)

// inboxFlags are the approvals inbox's flags (--approvals-*).
type inboxFlags struct {
	listen, tokens, as, groups, tlsCert, tlsKey string

	approvers []inbox.Approver
	operator  *inbox.Approver
}

func (f *inboxFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&f.listen, "approvals-listen", "", "serve the approvals inbox, a web page where approvers decide the calls awaiting their approval, at / on this address; empty: off")
	fs.StringVar(&f.tokens, "approvals-tokens", "", "the inbox's approvers: a YAML or JSON file giving each a name, groups and a token (token_sha256, token_env or token_file) to log in with; token_sha256 is the hash of a random token (openssl rand -hex 32), never of a password")
	fs.StringVar(&f.as, "approvals-as", "", "with no --approvals-tokens: the one approver the inbox acts as, with no login, answering on a loopback --approvals-listen only")
	fs.StringVar(&f.groups, "approvals-groups", "", "with --approvals-as: the approver groups it decides for, comma-separated")
	fs.StringVar(&f.tlsCert, "approvals-tls-cert", "", "serve the inbox over TLS with this certificate (PEM; with --approvals-tls-key)")
	fs.StringVar(&f.tlsKey, "approvals-tls-key", "", "the private key of --approvals-tls-cert (PEM)")
}

// check validates the flags and reads the approvers, before anything
// starts.
func (f *inboxFlags) check(getenv func(string) string) error {
	if f.listen == "" {
		if f.tokens != "" || f.as != "" || f.groups != "" || f.tlsCert != "" || f.tlsKey != "" {
			return cli.Usagef("the --approvals-* flags configure the inbox, which --approvals-listen ADDR turns on")
		}
		return nil
	}
	switch {
	case (f.tlsCert == "") != (f.tlsKey == ""):
		return cli.Usagef("--approvals-tls-cert and --approvals-tls-key go together")
	case f.tokens != "" && (f.as != "" || f.groups != ""):
		return cli.Usagef("--approvals-tokens gives each approver a token; --approvals-as and --approvals-groups are for an inbox without tokens: not both")
	case f.tokens != "":
		var err error
		if f.approvers, err = inbox.LoadApprovers(f.tokens, getenv); err != nil {
			return cli.Usagef("--approvals-tokens: %w", err)
		}
		return nil
	case f.as == "" || f.groups == "":
		return cli.Usagef("--approvals-listen needs its approvers: --approvals-tokens FILE (a token per approver), " +
			"or --approvals-as NAME --approvals-groups G1,G2 for one operator on this machine")
	case !inbox.Loopback(f.listen):
		return cli.Usagef("--approvals-as %s: an inbox without tokens lets anyone who reaches it decide as %s, so it listens on a loopback address only "+
			"(127.0.0.1:PORT, localhost:PORT), not %s; give approvers tokens with --approvals-tokens to serve it elsewhere", f.as, f.as, f.listen)
	}
	f.operator = &inbox.Approver{Name: f.as}
	for g := range strings.SplitSeq(f.groups, ",") {
		if g = strings.TrimSpace(g); g != "" {
			f.operator.Groups = append(f.operator.Groups, g)
		}
	}
	for _, g := range f.operator.Groups {
		if !ledger.ValidGroup(g) {
			return cli.Usagef("--approvals-groups: %q is not a group (letters, digits, _ and -)", g)
		}
	}
	return nil
}

// describe says who decides in the inbox, for the banner.
func (f *inboxFlags) describe() string {
	if f.operator != nil {
		return fmt.Sprintf("acting as %s for %s, no login, this machine only", f.operator.Name, strings.Join(f.operator.Groups, ", "))
	}
	var names []string
	for _, a := range f.approvers {
		names = append(names, a.Name)
	}
	return "approvers " + strings.Join(names, ", ") + " log in with their tokens"
}

// serve starts the inbox: its URL, and a stop that ends its event streams
// and its server.
func (f *inboxFlags) serve(appr *approvals.Service, store *ledger.Store, nc *nats.Conn, logger *slog.Logger) (string, func(), error) {
	in, err := inbox.New(inbox.Config{Approvals: appr, Ledger: store, Approvers: f.approvers, Operator: f.operator, Conn: nc, Logger: logger})
	if err != nil {
		return "", nil, err
	}
	l, err := net.Listen("tcp", f.listen)
	if err != nil {
		in.Close()
		return "", nil, fmt.Errorf("--approvals-listen %s: %w", f.listen, err)
	}
	// No write timeout: the page's event stream stays open.
	srv := &http.Server{Handler: in.Handler(), ReadHeaderTimeout: 5 * time.Second, IdleTimeout: 2 * time.Minute}
	scheme := "http"
	if f.tlsCert != "" {
		cert, err := tls.LoadX509KeyPair(f.tlsCert, f.tlsKey)
		if err != nil {
			l.Close()
			in.Close()
			return "", nil, fmt.Errorf("--approvals-tls-cert: %w", err)
		}
		srv.TLSConfig = &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}
		scheme = "https"
		go srv.ServeTLS(l, "", "")
	} else {
		go srv.Serve(l)
	}
	if f.operator == nil && f.tlsCert == "" && !inbox.Loopback(f.listen) {
		logger.Warn("the approvals inbox serves tokens and session cookies without TLS; give it --approvals-tls-cert and --approvals-tls-key, or put it behind a proxy that terminates TLS",
			"address", l.Addr().String())
	}
	return scheme + "://" + l.Addr().String() + "/", func() {
		in.Close() // ends the event streams, so that the shutdown does not wait for them
		sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		srv.Shutdown(sctx)
		srv.Close()
	}, nil
}
