// Package progress reports how far a long operator command has got (a
// replay, a requeue of every dead letter, a ledger purge): a bar with rate
// and ETA when the writer is a terminal, a plain line every few seconds
// otherwise, so that logs of a scripted run stay readable.
package progress

import (
	"fmt"
	"io"
	"os"
	"sync"
	"time"

	"github.com/mattn/go-isatty"
	"github.com/schollz/progressbar/v3"
)

// Interval is how often a writer that is not a terminal gets a line.
const Interval = 5 * time.Second

// Reporter reports the progress of one operation. Its methods are safe for
// concurrent use; a nil *Reporter reports nothing.
type Reporter struct {
	mu       sync.Mutex
	w        io.Writer
	what     string
	total    int64
	done     int64
	start    time.Time
	lastLine time.Time
	bar      *progressbar.ProgressBar
	finished bool
}

// New starts reporting an operation named what (e.g. "replay") of total
// steps (0 or less: unknown) on w.
func New(w io.Writer, what string, total int64) *Reporter {
	r := &Reporter{w: w, what: what, total: total, start: time.Now()}
	r.lastLine = r.start
	if f, ok := w.(*os.File); ok && (isatty.IsTerminal(f.Fd()) || isatty.IsCygwinTerminal(f.Fd())) {
		max := total
		if max <= 0 {
			max = -1
		}
		r.bar = progressbar.NewOptions64(max, progressbar.OptionSetWriter(w), progressbar.OptionSetDescription(what),
			progressbar.OptionShowCount(), progressbar.OptionShowIts(), progressbar.OptionSetItsString("jobs"),
			progressbar.OptionSetPredictTime(true), progressbar.OptionThrottle(100*time.Millisecond),
			progressbar.OptionClearOnFinish())
	}
	return r
}

// Set records that done steps of total are done (total 0 or less: keep the
// one given before).
func (r *Reporter) Set(done, total int64) {
	if r == nil {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.finished {
		return
	}
	if total > 0 && total != r.total {
		r.total = total
		if r.bar != nil {
			r.bar.ChangeMax64(total)
		}
	}
	r.done = done
	if r.bar != nil {
		_ = r.bar.Set64(done)
		return
	}
	if now := time.Now(); now.Sub(r.lastLine) >= Interval {
		r.lastLine = now
		fmt.Fprintln(r.w, r.line(now))
	}
}

// Finish ends the report; a writer that is not a terminal gets a last line.
func (r *Reporter) Finish() {
	if r == nil {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.finished {
		return
	}
	r.finished = true
	if r.bar != nil {
		_ = r.bar.Finish()
		return
	}
	fmt.Fprintln(r.w, r.line(time.Now()))
}

// line is "replay: 120/1000 (12%), 40.0/s, eta 22s".
func (r *Reporter) line(now time.Time) string {
	elapsed := now.Sub(r.start)
	rate := 0.0
	if elapsed > 0 {
		rate = float64(r.done) / elapsed.Seconds()
	}
	if r.total <= 0 {
		return fmt.Sprintf("%s: %d, %.1f/s", r.what, r.done, rate)
	}
	s := fmt.Sprintf("%s: %d/%d (%d%%), %.1f/s", r.what, r.done, r.total, r.done*100/r.total, rate)
	if left := r.total - r.done; left > 0 && rate > 0 {
		s += ", eta " + time.Duration(float64(left)/rate*float64(time.Second)).Round(time.Second).String()
	}
	return s
}
