package tools_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/net/http2"

	"github.com/toolq/toolq/tools"
)

// TestAWriteIsNeverResentOverHTTP2: a downstream speaking HTTP/2 that read
// a call to its end and then refuses the stream (PROTOCOL_ERROR or
// REFUSED_STREAM) or goes away (GOAWAY, last stream 0) gets it once: the
// transport retries such a stream only with a body it can rewind, and the
// executor hands it none. The call is ambiguous.
func TestAWriteIsNeverResentOverHTTP2(t *testing.T) {
	t.Parallel()
	answers := map[string]func(fr *http2.Framer, id uint32){
		"rst_protocol": func(fr *http2.Framer, id uint32) { fr.WriteRSTStream(id, http2.ErrCodeProtocol) },
		"rst_refused":  func(fr *http2.Framer, id uint32) { fr.WriteRSTStream(id, http2.ErrCodeRefusedStream) },
		"goaway":       func(fr *http2.Framer, id uint32) { fr.WriteGoAway(0, http2.ErrCodeNo, nil) },
	}
	for name, answer := range answers {
		for _, method := range []string{"POST", "DELETE", "GET"} {
			t.Run(name+"/"+method, func(t *testing.T) {
				t.Parallel()
				var effects atomic.Int32
				url := h2cDownstream(t, &effects, answer)
				var p http.Protocols
				p.SetUnencryptedHTTP2(true)
				transport := &http.Transport{Protocols: &p}
				defer transport.CloseIdleConnections()
				exec, err := tools.HTTPExecutor(tools.HTTP{Method: method, URL: url + "/v1/x", Client: &http.Client{Transport: transport}})
				if err != nil {
					t.Fatal(err)
				}
				ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
				defer cancel()
				_, err = exec.Execute(ctx, tools.Request{Tool: "t", Key: "k1", Args: json.RawMessage(`{"a":1}`)})
				if o, te := tools.Classify(err); o != tools.Ambiguous {
					t.Errorf("outcome %s (%v), want ambiguous", o, te)
				}
				if n := effects.Load(); n != 1 {
					t.Fatalf("%d effects for one call: the HTTP client re-sent it", n)
				}
			})
		}
	}
}

// h2cDownstream speaks HTTP/2 with prior knowledge: each request it read to
// its END_STREAM is an effect, answered by answer.
func h2cDownstream(t *testing.T, effects *atomic.Int32, answer func(fr *http2.Framer, id uint32)) string {
	return rawListener(t, func(c net.Conn) {
		defer c.Close()
		if _, err := io.ReadFull(c, make([]byte, len(http2.ClientPreface))); err != nil {
			return
		}
		fr := http2.NewFramer(c, c)
		fr.WriteSettings()
		for {
			f, err := fr.ReadFrame()
			if err != nil {
				return
			}
			switch f := f.(type) {
			case *http2.SettingsFrame:
				if !f.IsAck() {
					fr.WriteSettingsAck()
				}
			case *http2.PingFrame:
				if !f.IsAck() {
					fr.WritePing(true, f.Data)
				}
			case *http2.HeadersFrame:
				if f.StreamEnded() {
					effects.Add(1)
					answer(fr, f.StreamID)
				}
			case *http2.DataFrame:
				if f.StreamEnded() {
					effects.Add(1)
					answer(fr, f.StreamID)
				}
			}
		}
	})
}

// TestAWriteOfAnySizeIsNeverResentOverHTTP1: a body in memory (up to 1 MiB)
// or streamed (larger), a kept-alive connection the downstream closes after
// reading the call: one effect, ambiguous.
func TestAWriteOfAnySizeIsNeverResentOverHTTP1(t *testing.T) {
	t.Parallel()
	for _, size := range []int{10, 1 << 20, 1<<20 + 1, 3 << 20} {
		t.Run(fmt.Sprint(size), func(t *testing.T) {
			t.Parallel()
			var effects atomic.Int32
			var drop atomic.Bool
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				io.Copy(io.Discard, r.Body)
				effects.Add(1)
				if drop.Load() {
					c, _, _ := w.(http.Hijacker).Hijack()
					c.Close() // no answer
					return
				}
				fmt.Fprint(w, `{}`)
			}))
			defer srv.Close()
			exec, err := tools.HTTPExecutor(tools.HTTP{Method: "POST", URL: srv.URL + "/v1/x"})
			if err != nil {
				t.Fatal(err)
			}
			args := json.RawMessage(`{"a":"` + strings.Repeat("x", size-8) + `"}`)
			if _, err := exec.Execute(context.Background(), tools.Request{Tool: "t", Key: "k1", Args: args}); err != nil { // leaves a connection to reuse
				t.Fatal(err)
			}
			drop.Store(true)
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			_, err = exec.Execute(ctx, tools.Request{Tool: "t", Key: "k2", Args: args})
			if o, te := tools.Classify(err); o != tools.Ambiguous {
				t.Errorf("outcome %s (%v), want ambiguous", o, te)
			}
			if n := effects.Load(); n != 2 {
				t.Fatalf("%d effects for 2 calls: the HTTP client re-sent one", n)
			}
		})
	}
}
