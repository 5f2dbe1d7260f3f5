package main

import "testing"

func TestAnUnverifiedTLSDatabaseURLToAnotherHostIsFound(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		url        string
		env        map[string]string
		unverified bool
	}{
		{"postgres://toolq:pw@db.internal:5432/toolq", nil, true}, // pgx's default: prefer
		{"postgres://toolq:pw@db.internal/toolq?sslmode=disable", nil, true},
		{"postgres://toolq:pw@db.internal/toolq?sslmode=allow", nil, true},
		{"postgres://toolq:pw@db.internal/toolq?sslmode=prefer", nil, true},
		{"postgres://toolq:pw@db.internal/toolq?sslmode=require", nil, true},
		{"postgresql://toolq:pw@10.0.0.5/toolq?sslmode=require", nil, true},
		{"postgres://toolq:pw@127.0.0.1:5432,db.internal:5432/toolq?sslmode=require", nil, true},
		{"postgres://toolq:pw@/toolq?host=db.internal&sslmode=require", nil, true},
		{"postgres://toolq:pw@db.internal/toolq", map[string]string{"PGSSLMODE": "require"}, true},
		{"postgres://toolq:pw@db.internal/toolq?sslmode=verify-full&sslrootcert=/etc/toolq/ca.pem", nil, false},
		{"postgres://toolq:pw@db.internal/toolq?sslmode=verify-ca&sslrootcert=/etc/toolq/ca.pem", nil, false},
		{"postgres://toolq:pw@db.internal/toolq?sslmode=require&sslrootcert=/etc/toolq/ca.pem", nil, false}, // pgx: verify-ca
		{"postgres://toolq:pw@db.internal/toolq", map[string]string{"PGSSLMODE": "verify-full"}, false},
		{"postgres://toolq:pw@localhost:5432/toolq", nil, false},
		{"postgres://toolq:pw@127.0.0.1/toolq?sslmode=disable", nil, false},
		{"postgres://toolq:pw@[::1]:5432/toolq", nil, false},
		{"postgres://toolq@/toolq?host=/var/run/postgresql", nil, false},
		{"postgres://toolq@/toolq", nil, false},
		{"", nil, false},
	} {
		_, got := unverifiedTLS(tc.url, func(k string) string { return tc.env[k] })
		if got != tc.unverified {
			t.Errorf("unverifiedTLS(%q, %v) = %v, want %v", tc.url, tc.env, got, tc.unverified)
		}
	}
}
