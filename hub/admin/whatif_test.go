package admin

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/meshfed/meshfed/internal/cli"
)

// A hub evaluating another candidate answers 429 with Retry-After: whatif waits as it says
// and asks again, a few times, then gives up with the hub's words.
func TestWhatifWaitsForABusyHub(t *testing.T) {
	var asked, busyFor atomic.Int32
	busyFor.Store(2)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodPost || r.URL.Path != "/api/dryrun" {
			http.Error(w, "unexpected "+r.Method+" "+r.URL.Path, http.StatusBadRequest)
			return
		}
		if asked.Add(1) <= busyFor.Load() {
			w.Header().Set("Retry-After", "0")
			http.Error(w, "another dry run of a candidate is being evaluated", http.StatusTooManyRequests)
			return
		}
		fmt.Fprintln(w, `{"identity":"","nodeId":"istiod-1","rules":["all"],"resources":{},"candidate":true,"needsRestart":["serve"]}`)
	}))
	defer srv.Close()
	c := &client{base: srv.URL, http: srv.Client()}
	out := cli.Output{Format: "table"}
	var w bytes.Buffer
	if err := whatif(context.Background(), c, &out, &w, url.Values{"node": {"istiod-1"}}, []byte("x: y"), true); err != nil || asked.Load() != 3 ||
		!strings.Contains(w.String(), "needs a restart: serve changed") {
		t.Errorf("after two 429s: %v, asked %d times:\n%s", err, asked.Load(), w.String())
	}

	asked.Store(0)
	busyFor.Store(100)
	err := whatif(context.Background(), c, &out, &w, url.Values{"node": {"istiod-1"}}, []byte("x: y"), true)
	var busy *BusyError
	if !errors.As(err, &busy) || asked.Load() != whatifTries || err.Error() != "429 Too Many Requests: another dry run of a candidate is being evaluated" || busy.RetryAfter != 0 {
		t.Errorf("a hub that stays busy: %v after %d questions, want the hub's 429 after %d", err, asked.Load(), whatifTries)
	}
}
