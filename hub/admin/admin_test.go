package admin

import (
	"os/exec"
	"strings"
	"testing"
)

// The operator's commands link the admin API's contract, not the server: neither the hub's
// core nor its replica layer (memberlist).
func TestLinksOnlyTheContract(t *testing.T) {
	out, err := exec.Command("go", "list", "-deps", ".").CombinedOutput()
	if err != nil {
		t.Fatalf("go list: %v\n%s", err, out)
	}
	for _, dep := range strings.Fields(string(out)) {
		switch {
		case dep == "github.com/meshfed/meshfed/hub", strings.HasPrefix(dep, "github.com/meshfed/meshfed/hub/replicas"),
			strings.Contains(dep, "hashicorp/memberlist"), dep == "github.com/meshfed/meshfed/routing", dep == "github.com/meshfed/meshfed/hub/acl":
			t.Errorf("hub/admin links %s", dep)
		}
	}
}
