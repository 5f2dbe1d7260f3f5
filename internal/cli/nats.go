package cli

import (
	"flag"
	"fmt"
	"strings"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/toolq/toolq/embedded"
)

// NATSFlags are the connection flags every command that talks to NATS takes,
// each with the environment variable the NATS tools use.
type NATSFlags struct {
	URL      string
	Creds    string
	NKey     string
	User     string
	Password string
	Token    string
	CA       string
	Cert     string
	Key      string
}

// Register adds the flags to fs; defaultURL is the URL when neither the flag
// nor NATS_URL is given.
func (f *NATSFlags) Register(fs *flag.FlagSet, getenv func(string) string, defaultURL, urlHelp string) {
	fs.StringVar(&f.URL, "nats-url", Env(getenv, "NATS_URL", defaultURL), urlHelp+" (env NATS_URL)")
	fs.StringVar(&f.Creds, "nats-creds", Env(getenv, "NATS_CREDS", ""), "NATS credentials file (env NATS_CREDS)")
	fs.StringVar(&f.NKey, "nats-nkey", Env(getenv, "NATS_NKEY", ""), "NATS nkey seed file (env NATS_NKEY)")
	fs.StringVar(&f.User, "nats-user", Env(getenv, "NATS_USER", ""), "NATS user (env NATS_USER)")
	fs.StringVar(&f.Password, "nats-password", Env(getenv, "NATS_PASSWORD", ""), "NATS password (env NATS_PASSWORD)")
	fs.StringVar(&f.Token, "nats-token", Env(getenv, "NATS_TOKEN", ""), "NATS token (env NATS_TOKEN)")
	fs.StringVar(&f.CA, "nats-ca", Env(getenv, "NATS_CA", ""), "CA certificate for NATS TLS (env NATS_CA)")
	fs.StringVar(&f.Cert, "nats-cert", Env(getenv, "NATS_CERT", ""), "client certificate for NATS TLS (env NATS_CERT)")
	fs.StringVar(&f.Key, "nats-key", Env(getenv, "NATS_KEY", ""), "client key for NATS TLS (env NATS_KEY)")
}

// Options turns the flags into connection options.
func (f *NATSFlags) Options(name string) ([]nats.Option, error) {
	if err := checkNATSURL(f.URL); err != nil {
		return nil, err
	}
	opts := []nats.Option{nats.Name(name), nats.MaxReconnects(-1)}
	if f.Creds != "" {
		opts = append(opts, nats.UserCredentials(f.Creds))
	}
	if f.NKey != "" {
		o, err := nats.NkeyOptionFromSeed(f.NKey)
		if err != nil {
			return nil, err
		}
		opts = append(opts, o)
	}
	if f.User != "" {
		opts = append(opts, nats.UserInfo(f.User, f.Password))
	}
	if f.Token != "" {
		opts = append(opts, nats.Token(f.Token))
	}
	if f.CA != "" {
		opts = append(opts, nats.RootCAs(f.CA))
	}
	if (f.Cert == "") != (f.Key == "") {
		return nil, Usagef("--nats-cert and --nats-key go together")
	}
	if f.Cert != "" {
		opts = append(opts, nats.ClientCert(f.Cert, f.Key))
	}
	return opts, nil
}

// checkNATSURL refuses a URL NATS cannot connect to, saying why: NATS
// speaks its own protocol, not HTTP.
func checkNATSURL(urls string) error {
	for _, u := range strings.Split(urls, ",") {
		scheme, _, ok := strings.Cut(strings.TrimSpace(u), "://")
		if !ok {
			continue // host:port: nats.go assumes nats://
		}
		switch strings.ToLower(scheme) {
		case "nats", "tls", "ws", "wss":
		case "http", "https":
			return Usagef("--nats-url %s: NATS speaks its own protocol, not HTTP: use nats://HOST:4222 (or tls://); 8222 is the monitoring port", u)
		default:
			return Usagef("--nats-url %s: unknown scheme %q (want nats://, tls://, ws:// or wss://)", u, scheme)
		}
	}
	return nil
}

// Connect connects with the flags' options; the error names the URL.
func (f *NATSFlags) Connect(name string) (*nats.Conn, error) {
	opts, err := f.Options(name)
	if err != nil {
		return nil, err
	}
	nc, err := nats.Connect(f.URL, opts...)
	if err != nil {
		return nil, fmt.Errorf("connect to NATS at %s: %w", embedded.RedactURL(f.URL), err)
	}
	return nc, nil
}

// JetStream connects and returns the connection with its JetStream context;
// close the connection when done.
func (f *NATSFlags) JetStream(name string) (*nats.Conn, jetstream.JetStream, error) {
	nc, err := f.Connect(name)
	if err != nil {
		return nil, nil, err
	}
	js, err := jetstream.New(nc)
	if err != nil {
		nc.Close()
		return nil, nil, err
	}
	return nc, js, nil
}
