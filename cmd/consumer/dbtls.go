package main

import (
	"net"
	"net/url"
	"strings"
)

// unverifiedTLS says whether a Postgres database URL would send the
// ledger's password to a server other than its host's without noticing:
// a host that is not this machine's, and an sslmode (the URL's, else
// PGSSLMODE's, else pgx's default, prefer) that checks no certificate:
// disable, allow, prefer, or require without sslrootcert (with one, pgx
// checks the authority, as verify-ca). It returns the sslmode it found.
func unverifiedTLS(databaseURL string, getenv func(string) string) (string, bool) {
	rest, ok := strings.CutPrefix(databaseURL, "postgres://")
	if !ok {
		if rest, ok = strings.CutPrefix(databaseURL, "postgresql://"); !ok {
			return "", false
		}
	}
	authority, query, _ := strings.Cut(rest, "?")
	if i := strings.IndexByte(authority, '/'); i >= 0 {
		authority = authority[:i]
	}
	if at := strings.LastIndexByte(authority, '@'); at >= 0 {
		authority = authority[at+1:]
	}
	params, _ := url.ParseQuery(query)
	setting := func(name, env string) string {
		if v := params.Get(name); v != "" {
			return v
		}
		return getenv(env)
	}
	hosts := authority
	if h := params.Get("host"); h != "" {
		hosts = h
	}
	if hosts == "" {
		hosts = getenv("PGHOST")
	}
	remote := false
	for _, h := range strings.Split(hosts, ",") {
		if host, _, err := net.SplitHostPort(h); err == nil {
			h = host
		}
		h = strings.Trim(h, "[]")
		ip := net.ParseIP(h)
		if h != "" && h != "localhost" && !strings.HasPrefix(h, "/") && (ip == nil || !ip.IsLoopback()) {
			remote = true
		}
	}
	mode := setting("sslmode", "PGSSLMODE")
	switch {
	case !remote:
		return mode, false
	case mode == "verify-full", mode == "verify-ca":
		return mode, false
	case mode == "require":
		return mode, setting("sslrootcert", "PGSSLROOTCERT") == ""
	}
	return mode, true
}
