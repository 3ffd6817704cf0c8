package hub

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/meshfed/meshfed/hub/api"
)

// A refused push is an event with its reason class, of the cluster's tenant; a tenant's
// operator is shown its own tenant's events only, and the vendor all of them.
func TestRefusalsAreEventsOfTheirTenant(t *testing.T) {
	h := testHub(t, twoTenants)
	if err := h.Apply("east", vsPush(t, "shop/a", "bank/x")); err == nil {
		t.Fatal("east published globex's namespace")
	}
	if err := h.Apply("north", vsPush(t, "cart/y")); err == nil {
		t.Fatal("north published acme's namespace")
	}
	all := h.Events(0)
	var refusals []string
	for _, e := range all.Events {
		if e.Kind == api.EventRefusal {
			refusals = append(refusals, fmt.Sprintf("%s %s %s %s", e.Tenant, e.Cluster, e.Name, e.Reason))
		}
	}
	if got, want := strings.Join(refusals, "; "), "acme east bank/x not_owned; globex north cart/y not_owned"; got != want {
		t.Errorf("the vendor's refusal events: %q, want %q", got, want)
	}
	acme := viewer{tenant: "acme", comp: h.current().comp}
	var shown []string
	for _, e := range h.events.since(acme, 0, "", 0).Events {
		if e.Tenant != "acme" {
			t.Errorf("acme's operator is shown %+v", e)
		}
		if e.Kind == api.EventRefusal {
			shown = append(shown, e.Cluster+" "+e.Name)
		}
	}
	if got := strings.Join(shown, "; "); got != "east bank/x" {
		t.Errorf("acme's operator is shown the refusals %q, want east's bank/x alone", got)
	}
}

// Each class of refusal gets its reason: an object that does not decode, one over a
// quota, one that lost a conflict.
func TestRefusalReasons(t *testing.T) {
	h := testHub(t, "sharedNamespaces: [shop]\n"+strings.Replace(twoClusters, "- {name: west, identities: [west], namespaces: [pay], hosts: [\"*\"]}",
		"- {name: west, identities: [west], namespaces: [pay, shop], hosts: [\"*\"], quotas: {maxObjects: 1}}", 1))
	if err := h.Apply("east", vsPush(t, "shop/a")); err != nil {
		t.Fatal(err)
	}
	_ = h.Apply("west", vsPush(t, "shop/a"))         // loses to east's: conflict
	_ = h.Apply("west", vsPush(t, "pay/b", "pay/c")) // one over maxObjects
	bad := vsPush(t, "pay/d")
	bad.Resources[0].Body.Value = []byte{0xff, 0xff}
	_ = h.Apply("west", bad)
	got := map[string]string{}
	for _, e := range h.Events(0).Events {
		if e.Kind == api.EventRefusal {
			got[e.Name] = e.Reason
		}
	}
	for name, want := range map[string]string{"shop/a": api.ReasonConflict, "pay/d": api.ReasonInvalid} {
		if got[name] != want {
			t.Errorf("%s refused as %q, want %q (all: %v)", name, got[name], want, got)
		}
	}
	// maxObjects 1: one of the two is stored, the other refused over the quota.
	if b, c := got["pay/b"], got["pay/c"]; !(b == api.ReasonOverQuota && c == "" || b == "" && c == api.ReasonOverQuota) {
		t.Errorf("pay/b refused as %q, pay/c as %q: want one over_quota, the other stored", b, c)
	}
}

// A tenant refusing in a loop pushes out its own history, not another tenant's.
func TestJournalRingPerTenant(t *testing.T) {
	j := newJournal()
	j.add(api.Event{Tenant: "b", Message: "b's"})
	j.add(api.Event{Message: "a reload"})
	for i := range 3 * eventsPerTenant {
		j.add(api.Event{Tenant: "a", Message: fmt.Sprint(i)})
	}
	comp := testHub(t, twoTenants).current().comp
	b := j.since(viewer{tenant: "b", comp: comp}, 0, "", 0)
	if len(b.Events) != 1 || b.Events[0].Message != "b's" || b.Dropped {
		t.Errorf("b's events after a's flood: %+v", b)
	}
	all := j.since(vendor(comp), 0, "", 0)
	if len(all.Events) != eventsPerTenant+2 || !all.Dropped || all.Next != uint64(3*eventsPerTenant+2) {
		t.Errorf("the vendor is shown %d events (dropped %v, next %d)", len(all.Events), all.Dropped, all.Next)
	}
	if all.Events[0].Message != "b's" || all.Events[1].Message != "a reload" {
		t.Errorf("oldest first: %+v", all.Events[:2])
	}
	// Asked from where it left off, a client gets what came after, and nothing dropped.
	j.add(api.Event{Tenant: "b", Message: "later"})
	next := j.since(vendor(comp), all.Next, "", 0)
	if len(next.Events) != 1 || next.Events[0].Message != "later" || next.Dropped {
		t.Errorf("after %d: %+v", all.Next, next)
	}
	// b's operator numbers b's events on their own: 1, 2, not the journal's; asking after
	// the last it saw, it is not told it missed a's.
	if b.Events[0].Seq != 1 || b.Next != 1 {
		t.Errorf("b's first event is %d, next %d: the gaps would count the others' events", b.Events[0].Seq, b.Next)
	}
	if nb := j.since(viewer{tenant: "b", comp: comp}, b.Next, "", 0); len(nb.Events) != 1 || nb.Events[0].Seq != 2 || nb.Dropped || nb.Reset {
		t.Errorf("b after %d: %+v", b.Next, nb)
	}
	if l := j.since(vendor(comp), 0, "", 10); len(l.Events) != 10 || l.Events[9].Message != "later" || !l.Dropped {
		t.Errorf("limit 10: the newest 10, dropped: %d, %+v", len(l.Events), l.Events[9])
	}
}

func TestEventsEndpointRefusesBadInput(t *testing.T) {
	h := testHub(t, twoClusters)
	for q, want := range map[string]string{"since=x": `since: "x"`, "limit=0": `limit: "0"`, "limit=-3": `limit: "-3"`, "sinc=5": `parameter "sinc": unknown`} {
		w := httptest.NewRecorder()
		h.serveEvents(w, httptest.NewRequest(http.MethodGet, "/api/events?"+q, nil))
		if w.Code != http.StatusBadRequest || !strings.Contains(w.Body.String(), want) {
			t.Errorf("?%s: %d %s", q, w.Code, w.Body)
		}
	}
}

// A sink's state is its worst collection's: a push unanswered is syncing, then stale
// after sinkStaleAfter; a NACK of the last push is NACKed until a later push is ACKed.
func TestSinkStates(t *testing.T) {
	t0 := time.Unix(1000, 0)
	st := func(colls map[string]*api.SinkCollection, at time.Duration) (string, *time.Time) {
		s := api.SinkStatus{Collections: colls}
		judge(&s, t0.Add(at), 30*time.Second)
		return s.State, s.BehindSince
	}
	acked := func() *api.SinkCollection {
		return &api.SinkCollection{PushedVersion: 3, AckedVersion: 3, LastPush: t0}
	}
	pending := func() *api.SinkCollection {
		return &api.SinkCollection{PushedVersion: 4, AckedVersion: 3, Pending: true, LastPush: t0}
	}
	nacked := func() *api.SinkCollection {
		return &api.SinkCollection{PushedVersion: 4, AckedVersion: 3, LastNACK: "InvalidArgument: no", NACKedVersion: 4, LastPush: t0}
	}
	for _, tc := range []struct {
		colls  map[string]*api.SinkCollection
		at     time.Duration
		want   string
		behind bool
	}{
		{map[string]*api.SinkCollection{}, 0, api.SinkSynced, false},
		{map[string]*api.SinkCollection{"a": acked()}, time.Hour, api.SinkSynced, false},
		{map[string]*api.SinkCollection{"a": acked(), "b": pending()}, 29 * time.Second, api.SinkSyncing, true},
		{map[string]*api.SinkCollection{"a": acked(), "b": pending()}, 30 * time.Second, api.SinkStale, true},
		{map[string]*api.SinkCollection{"a": nacked(), "b": pending()}, time.Hour, api.SinkNACKed, true},
		{map[string]*api.SinkCollection{"a": nacked()}, 0, api.SinkNACKed, false},
		// A NACK of an older push, and the last one ACKed since: synced.
		{map[string]*api.SinkCollection{"a": {PushedVersion: 5, AckedVersion: 5, LastNACK: "x", NACKedVersion: 4}}, 0, api.SinkSynced, false},
	} {
		got, behind := st(tc.colls, tc.at)
		if got != tc.want || (behind != nil) != tc.behind {
			t.Errorf("%v at +%s: %s (behind since %v), want %s", tc.colls, tc.at, got, behind, tc.want)
		}
	}
}

// An object a reload's new ownership withdraws is a refusal too, counted and shown with
// the others.
func TestReloadWithdrawalIsARefusal(t *testing.T) {
	h := testHub(t, twoClusters)
	if err := h.Apply("east", vsPush(t, "shop/a")); err != nil {
		t.Fatal(err)
	}
	reload(t, h, strings.Replace(twoClusters, "namespaces: [shop]", "namespaces: [other]", 1))
	var got []string
	for _, e := range h.Events(0).Events {
		if e.Kind == api.EventRefusal {
			got = append(got, e.Cluster+" "+e.Name+" "+e.Reason+" "+e.Message)
		}
	}
	if len(got) != 1 || !strings.HasPrefix(got[0], "east shop/a not_owned a configuration reload: ") {
		t.Errorf("refusal events after the reload: %q", got)
	}
}

// Numbers start again with the process: a client asking with another process's boot, or a
// number beyond the newest, is answered from the start and told to drop what it had.
func TestJournalReset(t *testing.T) {
	comp := testHub(t, twoTenants).current().comp
	old, j := newJournal(), newJournal()
	for range 5 {
		old.add(api.Event{Message: "before the restart"})
	}
	was := old.since(vendor(comp), 0, "", 0)
	j.add(api.Event{Message: "after"})
	for _, tc := range []struct {
		name string
		seq  uint64
		boot string
	}{{"another boot", 1, was.Boot}, {"beyond the newest", was.Next, ""}} {
		got := j.since(vendor(comp), tc.seq, tc.boot, 0)
		if !got.Reset || len(got.Events) != 1 || got.Events[0].Message != "after" || got.Boot == was.Boot {
			t.Errorf("%s: %+v", tc.name, got)
		}
	}
	if got := j.since(vendor(comp), 1, j.since(vendor(comp), 0, "", 0).Boot, 0); got.Reset || len(got.Events) != 0 {
		t.Errorf("the same process, up to date: %+v", got)
	}
}
