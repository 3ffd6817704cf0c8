package replicatest

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
)

// Net puts replicas in network namespaces of their own, each with one address on a bridge
// that the test's own namespace (its minions and sinks) is also on, so the test can cut
// replicas off from each other (blackhole routes inside their namespaces) while every
// minion and sink still reaches every replica. It needs root and iproute2's ip.
type Net struct {
	tb     TB
	id     string
	bridge string
	ns     map[string]string // replica -> namespace
	ip     map[string]string // replica -> address
	veths  []string
	cut    [][2]string // namespace, blackholed address
}

// NetAvailable says why network namespaces cannot be made here, or "" if they can.
func NetAvailable() string {
	if os.Geteuid() != 0 {
		return "network namespaces need root"
	}
	if _, err := exec.LookPath("ip"); err != nil {
		return "iproute2's ip is not installed"
	}
	return ""
}

func ip(args ...string) error {
	out, err := exec.Command("ip", args...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("ip %s: %v: %s", strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return nil
}

// NewNet creates a namespace per replica name, on a bridge of a private /24 (10.231.x.0),
// removed when the test ends.
func NewNet(tb TB, replicas ...string) *Net {
	tb.Helper()
	pid := os.Getpid()
	n := &Net{tb: tb, id: fmt.Sprintf("%d", pid%100000), ns: map[string]string{}, ip: map[string]string{}}
	subnet := fmt.Sprintf("10.231.%d", pid%250+1)
	n.bridge = "mfbr" + n.id
	tb.Cleanup(n.remove)
	must := func(args ...string) {
		if err := ip(args...); err != nil {
			tb.Fatal(err)
		}
	}
	must("link", "add", "name", n.bridge, "type", "bridge")
	must("addr", "add", subnet+".254/24", "dev", n.bridge)
	must("link", "set", n.bridge, "up")
	for i, r := range replicas {
		ns := fmt.Sprintf("mf%s-%s", n.id, r)
		host, peer := fmt.Sprintf("mfv%s%s", n.id, r), fmt.Sprintf("mfp%s%s", n.id, r)
		n.ns[r], n.ip[r] = ns, fmt.Sprintf("%s.%d", subnet, i+1)
		must("netns", "add", ns)
		must("link", "add", host, "type", "veth", "peer", "name", peer)
		n.veths = append(n.veths, host)
		must("link", "set", host, "master", n.bridge)
		must("link", "set", host, "up")
		must("link", "set", peer, "netns", ns)
		must("-n", ns, "addr", "add", n.ip[r]+"/24", "dev", peer)
		must("-n", ns, "link", "set", peer, "up")
		must("-n", ns, "link", "set", "lo", "up")
	}
	return n
}

// IP returns replica's address.
func (n *Net) IP(replica string) string { return n.ip[replica] }

// Split cuts every replica of one side off from every replica of the other, both ways, by
// blackhole routes in the other side's namespaces only: what the other side sends to one
// fails at once, while what one side sends to the other arrives and its answers vanish, so
// one side sees errors and the other silence (timeouts), as in real partitions.
func (n *Net) Split(one, other []string) {
	n.tb.Helper()
	for _, a := range one {
		for _, b := range other {
			p := [2]string{n.ns[b], n.ip[a]}
			if err := ip("-n", p[0], "route", "add", "blackhole", p[1]+"/32"); err != nil {
				n.tb.Fatal(err)
			}
			n.cut = append(n.cut, p)
		}
	}
}

// Heal undoes every Split.
func (n *Net) Heal() {
	n.tb.Helper()
	for _, p := range n.cut {
		if err := ip("-n", p[0], "route", "del", "blackhole", p[1]+"/32"); err != nil {
			n.tb.Fatal(err)
		}
	}
	n.cut = nil
}

func (n *Net) remove() {
	var errs []error
	for _, ns := range n.ns {
		if err := ip("netns", "del", ns); err != nil {
			errs = append(errs, err)
		}
	}
	for _, v := range n.veths {
		_ = ip("link", "del", v) // gone with its peer's namespace, usually
	}
	if err := ip("link", "del", n.bridge); err != nil {
		errs = append(errs, err)
	}
	if err := errors.Join(errs...); err != nil {
		n.tb.Logf("removing the test network: %v", err)
	}
}
