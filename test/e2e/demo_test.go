package e2e

import (
	"bytes"
	"context"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/meshfed/meshfed/internal/testkit/replicatest"
	"github.com/meshfed/meshfed/internal/testkit/testbin"
)

// TestDemo runs `make demo`'s script as a user would (real hub and minion processes, the
// development CA, mutual TLS), in its self-checking mode: it ends by itself once the sink
// shows the federated state and `hub why` explains the refused resource.
func TestDemo(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the hub and minion binaries")
	}
	root, err := testbin.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	// The script takes its addresses up front: ports the kernel never hands to other
	// processes meanwhile (the replica tests start many in parallel).
	free := func() string { return replicatest.FreeAddr(t, false) }
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "bash", filepath.Join(root, "hack/demo.sh"))
	cmd.Dir = root
	cmd.Env = append(cmd.Environ(), "DEMO_CHECK=1", "DEMO_DIR="+t.TempDir(), "DEMO_INGEST="+free(), "DEMO_SERVE="+free(), "DEMO_HTTP="+free())
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err = cmd.Run()
	_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) // whatever the script left behind
	if err != nil || !strings.Contains(out.String(), "demo: OK") {
		t.Fatalf("demo: %v\n%s", err, out.String())
	}
	for _, want := range []string{"pay/payments from west", "istio-system/default from west", `refused from cluster west: host "cart.shop.svc.cluster.local"`} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("demo output lacks %q", want)
		}
	}
}
