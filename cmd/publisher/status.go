package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/toolq/toolq/internal/cli"
	"github.com/toolq/toolq/internal/jsretry"
	"github.com/toolq/toolq/jobs"
	"github.com/toolq/toolq/ledger"
)

// status is what `publisher status --json` prints.
type status struct {
	Streams     []streamStatus    `json:"streams"`
	Consumers   []consumerStatus  `json:"consumers"`        // the durable consumers on TOOLQ_JOBS
	DeadLetters map[string]uint64 `json:"dead_letters"`     // TOOLQ_DLQ's depth by reason
	Ledger      map[string]int64  `json:"ledger,omitempty"` // rows by state, and "stale"
	Oldest      *oldestInFlight   `json:"oldest_in_flight,omitempty"`
	LedgerErr   string            `json:"ledger_error,omitempty"`
}

// oldestInFlight is the in-flight row whose lease ends (or ended) first.
type oldestInFlight struct {
	Key            string    `json:"key"`
	Tool           string    `json:"tool"`
	ConversationID string    `json:"conversation_id"`
	Owner          string    `json:"owner"`
	Attempt        int64     `json:"attempt"`
	LeaseUntil     time.Time `json:"lease_until"`
	Expired        bool      `json:"expired"`
	ClaimedAt      time.Time `json:"updated_at"`
}

type streamStatus struct {
	Name     string `json:"name"`
	Messages uint64 `json:"messages"`
	Bytes    uint64 `json:"bytes"`
	FirstSeq uint64 `json:"first_seq"`
	LastSeq  uint64 `json:"last_seq"`
}

type consumerStatus struct {
	Name         string `json:"name"`
	Filter       string `json:"filter"`
	Pending      uint64 `json:"pending"`
	AckPending   int    `json:"ack_pending"`
	Redelivered  int    `json:"redelivered"`
	WaitingPulls int    `json:"waiting_pulls"`
	DeliveredSeq uint64 `json:"delivered_stream_seq"`
	AckFloorSeq  uint64 `json:"ack_floor_stream_seq"`
}

func runStatus(ctx context.Context, args []string, stdio cli.IO, getenv func(string) string) error {
	fs := cli.NewFlagSet("status", "publisher status [--json] [--database-url URL | --data-dir DIR]\n\n"+
		"Prints the streams, the durable consumers on TOOLQ_JOBS (pending, awaiting ack,\n"+
		"redelivered; not the ephemeral ones replays and listings create), the dead letters by\n"+
		"reason, the ledger's rows by state (stale: in flight with an expired lease) and its\n"+
		"oldest in-flight lease.", stdio)
	var nf cli.NATSFlags
	nf.Register(fs, getenv, "nats://127.0.0.1:4222", "NATS server URL")
	databaseURL := fs.String("database-url", cli.Env(getenv, "DATABASE_URL", ""), "the ledger (env DATABASE_URL); empty: the SQLite ledger under --data-dir")
	dataDir := fs.String("data-dir", cli.Env(getenv, "TOOLQ_DATA_DIR", "./toolq-data"), "data directory of an embedded consumer (env TOOLQ_DATA_DIR)")
	noLedger := fs.Bool("no-ledger", false, "do not read the ledger")
	asJSON := fs.Bool("json", false, "print JSON")
	if err := cli.ParseNone(fs, args); err != nil {
		return err
	}
	nc, js, err := nf.JetStream("toolq status")
	if err != nil {
		return err
	}
	defer nc.Close()
	var st status
	for _, name := range []string{jobs.JobsStream, jobs.ResultsStream, jobs.DLQStream} {
		s, err := jsretry.Do(ctx, func(ctx context.Context) (jetstream.Stream, error) { return js.Stream(ctx, name) })
		if errors.Is(err, jetstream.ErrStreamNotFound) {
			return fmt.Errorf("stream %s does not exist: has a consumer run against this server?", name)
		}
		if err != nil {
			return fmt.Errorf("stream %s: %w", name, err)
		}
		info := s.CachedInfo()
		st.Streams = append(st.Streams, streamStatus{Name: name, Messages: info.State.Msgs, Bytes: info.State.Bytes,
			FirstSeq: info.State.FirstSeq, LastSeq: info.State.LastSeq})
		if name == jobs.DLQStream {
			if st.DeadLetters, err = deadLettersByReason(ctx, s); err != nil {
				return err
			}
		}
		if name != jobs.JobsStream {
			continue
		}
		names := s.ConsumerNames(ctx)
		for cname := range names.Name() {
			c, err := jsretry.Do(ctx, func(ctx context.Context) (jetstream.Consumer, error) { return s.Consumer(ctx, cname) })
			if errors.Is(err, jetstream.ErrConsumerNotFound) {
				continue // an ordered consumer gone since it was listed
			}
			if err != nil {
				return err
			}
			ci := c.CachedInfo()
			if ci.Config.Durable == "" {
				continue // ephemeral: a replay's, a listing's or a client's ordered consumer
			}
			st.Consumers = append(st.Consumers, consumerStatus{Name: cname, Filter: ci.Config.FilterSubject, Pending: ci.NumPending,
				AckPending: ci.NumAckPending, Redelivered: ci.NumRedelivered, WaitingPulls: ci.NumWaiting,
				DeliveredSeq: ci.Delivered.Stream, AckFloorSeq: ci.AckFloor.Stream})
		}
		if err := names.Err(); err != nil {
			return err
		}
	}
	if !*noLedger {
		if err := readLedgerStatus(ctx, *databaseURL, *dataDir, &st); err != nil {
			st.LedgerErr = err.Error()
		}
	}
	if *asJSON {
		return cli.PrintJSON(stdio.Out, st)
	}
	w := cli.NewTable(stdio.Out)
	fmt.Fprintln(w, "STREAM\tMESSAGES\tBYTES\tFIRST SEQ\tLAST SEQ")
	for _, s := range st.Streams {
		fmt.Fprintf(w, "%s\t%d\t%d\t%d\t%d\n", s.Name, s.Messages, s.Bytes, s.FirstSeq, s.LastSeq)
	}
	fmt.Fprintln(w, "\nCONSUMER\tFILTER\tPENDING\tACK PENDING\tREDELIVERED\tACK FLOOR")
	for _, c := range st.Consumers {
		fmt.Fprintf(w, "%s\t%s\t%d\t%d\t%d\t%d\n", c.Name, c.Filter, c.Pending, c.AckPending, c.Redelivered, c.AckFloorSeq)
	}
	fmt.Fprintln(w, "\nDEAD LETTERS\tINVALID\tTOO LARGE\tMAX DELIVER\tOTHER")
	other := uint64(0)
	for r, n := range st.DeadLetters {
		if r != jobs.DLQInvalid && r != jobs.DLQTooLarge && r != jobs.DLQMaxDeliver {
			other += n
		}
	}
	fmt.Fprintf(w, "\t%d\t%d\t%d\t%d\n", st.DeadLetters[jobs.DLQInvalid], st.DeadLetters[jobs.DLQTooLarge], st.DeadLetters[jobs.DLQMaxDeliver], other)
	switch {
	case st.Ledger != nil:
		fmt.Fprintln(w, "\nLEDGER\tIN FLIGHT\tSTALE\tCOMPLETED\tFAILED\tINDETERMINATE")
		fmt.Fprintf(w, "\t%d\t%d\t%d\t%d\t%d\n", st.Ledger["in_flight"], st.Ledger["stale"], st.Ledger["completed"], st.Ledger["failed"], st.Ledger["indeterminate"])
		if o := st.Oldest; o != nil {
			lease := "lease ends " + o.LeaseUntil.Format(time.RFC3339)
			if o.Expired {
				lease = fmt.Sprintf("lease expired %s ago (stale: its holder died)", time.Since(o.LeaseUntil).Round(time.Second))
			}
			fmt.Fprintf(w, "\noldest in flight:\t%s %s (conversation %s, owner %s, attempt %d): %s\n",
				o.Key, o.Tool, o.ConversationID, o.Owner, o.Attempt, lease)
		}
	case st.LedgerErr != "":
		fmt.Fprintf(w, "\nledger: %s\n", st.LedgerErr)
	}
	return w.Flush()
}

// openLedger opens the ledger to read it, without changing it: no
// migration, and no SQLite file created where there is none.
func openLedger(ctx context.Context, databaseURL, dataDir string) (*ledger.Store, error) {
	if databaseURL == "" {
		path := filepath.Join(dataDir, "ledger.db")
		if _, err := os.Stat(path); err != nil {
			return nil, fmt.Errorf("no ledger at %s (give --database-url or the consumer's --data-dir)", path)
		}
	}
	return ledger.Open(ctx, databaseURL, dataDir)
}

// readLedgerStatus reads the ledger's rows by state and its oldest in-flight
// row into st.
func readLedgerStatus(ctx context.Context, databaseURL, dataDir string, st *status) error {
	store, err := openLedger(ctx, databaseURL, dataDir)
	if err != nil {
		return err
	}
	defer store.Close()
	if st.Ledger, err = store.Counts(ctx); err != nil {
		return err
	}
	r, err := store.OldestInFlight(ctx)
	switch {
	case errors.Is(err, ledger.ErrNotFound):
		return nil
	case err != nil:
		return err
	}
	st.Oldest = &oldestInFlight{Key: r.Key, Tool: r.Tool, ConversationID: r.ConversationID, Owner: r.Owner, Attempt: r.Attempt,
		LeaseUntil: r.LeaseUntil, Expired: r.LeaseExpired(), ClaimedAt: r.UpdatedAt}
	return nil
}

// deadLettersByReason counts the messages of TOOLQ_DLQ by the last token
// of their subject.
func deadLettersByReason(ctx context.Context, s jetstream.Stream) (map[string]uint64, error) {
	info, err := jsretry.Do(ctx, func(ctx context.Context) (*jetstream.StreamInfo, error) {
		return s.Info(ctx, jetstream.WithSubjectFilter(jobs.DLQSubjects))
	})
	if err != nil {
		return nil, fmt.Errorf("stream %s: %w", jobs.DLQStream, err)
	}
	out := map[string]uint64{}
	for subject, n := range info.State.Subjects {
		out[strings.TrimPrefix(subject, jobs.DLQPrefix)] += n
	}
	return out, nil
}
