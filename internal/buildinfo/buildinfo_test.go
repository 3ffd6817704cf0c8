package buildinfo

import (
	"runtime/debug"
	"testing"
)

// What the toolchain records is read field by field; a link-time Version wins over the
// module's.
func TestFromBuild(t *testing.T) {
	bi := &debug.BuildInfo{GoVersion: "go1.99", Main: debug.Module{Version: "(devel)"}, Settings: []debug.BuildSetting{
		{Key: "vcs.revision", Value: "0123456789abcdef0123"}, {Key: "vcs.time", Value: "2026-11-23T10:00:00Z"}, {Key: "vcs.modified", Value: "true"},
	}}
	got := fromBuild(bi)
	want := Info{Version: "(devel)", Revision: "0123456789abcdef0123", Time: "2026-11-23T10:00:00Z", Modified: true, GoVersion: "go1.99"}
	if got != want {
		t.Errorf("fromBuild = %+v, want %+v", got, want)
	}
	if got.Short() != "0123456789ab" {
		t.Errorf("Short = %q", got.Short())
	}
	Version = "v1.2.3"
	defer func() { Version = "" }()
	if got := fromBuild(bi); got.Version != "v1.2.3" {
		t.Errorf("with a link-time Version: %q", got.Version)
	}
	if got := fromBuild(nil); got.Version != "v1.2.3" || got.GoVersion == "" || got.Short() != "unknown" {
		t.Errorf("nothing recorded: %+v", got)
	}
}

// A test binary has build info (its main module is this one).
func TestRead(t *testing.T) {
	if got := Read(); got.GoVersion == "" || got.Version == "" {
		t.Errorf("Read = %+v", got)
	}
}
