package monitoring

import (
	"bufio"
	"log/slog"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/prometheus/common/model"
	"github.com/prometheus/prometheus/model/rulefmt"
	"sigs.k8s.io/yaml"
)

// runbookBase is where every alert's runbook_url points: a section of README.md.
const runbookBase = "https://github.com/meshfed/meshfed/blob/main/README.md#"

// severities are the values of an alert's severity label that routes are written for.
var severities = map[string]bool{"critical": true, "warning": true, "info": true}

// loadRules reads the PrometheusRule's groups as Prometheus reads a rule file: rulefmt
// parses every expression, checks every template of the labels and annotations, and refuses
// fields it does not know.
func loadRules(t *testing.T) *rulefmt.RuleGroups {
	t.Helper()
	data, err := yaml.Marshal(map[string]any{"groups": rules(t).Spec.Groups})
	if err != nil {
		t.Fatal(err)
	}
	groups, errs := rulefmt.Parse(data, false, model.UTF8Validation, promql(), slog.New(slog.DiscardHandler))
	for _, err := range errs {
		t.Errorf("prometheusrule.yaml: %v", err)
	}
	if len(errs) > 0 {
		t.FailNow()
	}
	return groups
}

// Every alert parses and says how bad it is, what happened and where its runbook is: a
// section of README.md named after the alert.
func TestAlerts(t *testing.T) {
	anchors := readmeAnchors(t)
	n := 0
	for _, g := range loadRules(t).Groups {
		for _, r := range g.Rules {
			if r.Alert == "" {
				continue
			}
			n++
			where := g.Name + "/" + r.Alert
			if s := r.Labels["severity"]; !severities[s] {
				t.Errorf("%s: severity %q, want one of critical, warning, info", where, s)
			}
			for _, a := range []string{"summary", "description"} {
				if strings.TrimSpace(r.Annotations[a]) == "" {
					t.Errorf("%s: no %s annotation", where, a)
				}
			}
			url := r.Annotations["runbook_url"]
			if want := runbookBase + strings.ToLower(r.Alert); url != want {
				t.Errorf("%s: runbook_url %q, want %q", where, url, want)
			}
			if !anchors[strings.ToLower(r.Alert)] {
				t.Errorf("%s: README.md has no section %q (its runbook)", where, r.Alert)
			}
		}
	}
	// The list: disconnected, never synced, NACKing, stale, reload failed,
	// certificate expiring, warm-up not finishing.
	if n < 7 {
		t.Errorf("%d alerts, want at least the 7 the pack promises", n)
	}
}

// readmeAnchors returns the anchors GitHub gives README.md's headings.
func readmeAnchors(t *testing.T) map[string]bool {
	t.Helper()
	f, err := os.Open(filepath.Join(root, "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	punct := regexp.MustCompile(`[^\p{L}\p{N} _-]`)
	out := map[string]bool{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, "#") {
			continue
		}
		title := strings.TrimSpace(strings.TrimLeft(line, "#"))
		out[strings.ReplaceAll(punct.ReplaceAllString(strings.ToLower(title), ""), " ", "-")] = true
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}
