package ledger

import (
	"context"
	"embed"
	"fmt"
	"io/fs"
	"path"
	"sort"
	"strconv"
	"strings"
)

//go:embed migrations
var migrationFiles embed.FS

// migration is one versioned schema change: migrations/<backend>/NNNN_name.sql.
type migration struct {
	version int64
	name    string
	sql     string
}

func migrations(backend string) ([]migration, error) {
	dir := path.Join("migrations", backend)
	entries, err := fs.ReadDir(migrationFiles, dir)
	if err != nil {
		return nil, err
	}
	var out []migration
	for _, e := range entries {
		num, name, ok := strings.Cut(strings.TrimSuffix(e.Name(), ".sql"), "_")
		v, err := strconv.ParseInt(num, 10, 64)
		if !ok || err != nil {
			return nil, fmt.Errorf("migration file %s: want NNNN_name.sql", e.Name())
		}
		body, err := fs.ReadFile(migrationFiles, path.Join(dir, e.Name()))
		if err != nil {
			return nil, err
		}
		out = append(out, migration{version: v, name: name, sql: string(body)})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].version < out[j].version })
	return out, nil
}

// migrationTx is a transaction that holds the migration lock of its backend.
type migrationTx interface {
	exec(ctx context.Context, query string, args ...any) error
	versions(ctx context.Context) (map[int64]bool, error)
}

// applyMigrations applies, inside tx, each migration whose version is not
// recorded yet, and records it.
func applyMigrations(ctx context.Context, backend string, tx migrationTx, createTable, record string) error {
	all, err := migrations(backend)
	if err != nil {
		return err
	}
	if err := tx.exec(ctx, createTable); err != nil {
		return err
	}
	done, err := tx.versions(ctx)
	if err != nil {
		return err
	}
	for _, m := range all {
		if done[m.version] {
			continue
		}
		if err := tx.exec(ctx, m.sql); err != nil {
			return fmt.Errorf("migration %04d_%s: %w", m.version, m.name, err)
		}
		if err := tx.exec(ctx, record, m.version, m.name); err != nil {
			return err
		}
	}
	return nil
}

// rowIterator is what pgx.Rows and *sql.Rows have in common.
type rowIterator interface {
	Next() bool
	Scan(dest ...any) error
	Err() error
}

// scanVersions reads the applied versions from a query of
// toolq_schema_migrations.
func scanVersions(rows rowIterator) (map[int64]bool, error) {
	done := map[int64]bool{}
	for rows.Next() {
		var v int64
		if err := rows.Scan(&v); err != nil {
			return nil, err
		}
		done[v] = true
	}
	return done, rows.Err()
}
