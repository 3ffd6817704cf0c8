// Package buildinfo says which build of meshfed is running: the module version, the VCS
// revision and time it was built from, whether the work tree had uncommitted changes, and
// the Go version. It reads what the Go toolchain records in every binary
// (runtime/debug.ReadBuildInfo), so `go build`, `go install` and `make build` need no
// -ldflags for it; Version may be overridden by -ldflags for a release built from a tarball
// without VCS data.
//
// It is read by `hub version`, `minion version` and the hub's meshfed_build_info metric.
// It is not a place for anything else about the process.
package buildinfo

import (
	"runtime"
	"runtime/debug"
)

// Version, when set at link time (-ldflags "-X github.com/meshfed/meshfed/internal/buildinfo.Version=v1.2.3"),
// replaces the module version the toolchain recorded.
var Version string

// Info is one build's identity.
type Info struct {
	// Version is the main module's version: a tag (v1.2.3), a pseudo-version, or "(devel)"
	// for a build from a work tree.
	Version string `json:"version"`
	// Revision is the VCS commit the binary was built from, and Time its commit time
	// (RFC 3339); empty when the build had no VCS data (go run, -buildvcs=false, a tarball).
	Revision string `json:"revision,omitempty"`
	Time     string `json:"time,omitempty"`
	// Modified: the work tree had uncommitted changes at build time.
	Modified bool `json:"modified"`
	// GoVersion is the toolchain that built it.
	GoVersion string `json:"goVersion"`
}

// Read returns the running binary's Info.
func Read() Info {
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return fromBuild(nil)
	}
	return fromBuild(bi)
}

// fromBuild is Read's work on what the toolchain recorded (nil: nothing recorded, as in a
// binary built without module support).
func fromBuild(bi *debug.BuildInfo) Info {
	info := Info{Version: "(unknown)", GoVersion: runtime.Version()}
	if bi != nil {
		if bi.Main.Version != "" {
			info.Version = bi.Main.Version
		}
		if bi.GoVersion != "" {
			info.GoVersion = bi.GoVersion
		}
		for _, s := range bi.Settings {
			switch s.Key {
			case "vcs.revision":
				info.Revision = s.Value
			case "vcs.time":
				info.Time = s.Value
			case "vcs.modified":
				info.Modified = s.Value == "true"
			}
		}
	}
	if Version != "" {
		info.Version = Version
	}
	return info
}

// Short is the revision's first 12 characters (as git shows it), or "unknown".
func (i Info) Short() string {
	switch {
	case i.Revision == "":
		return "unknown"
	case len(i.Revision) > 12:
		return i.Revision[:12]
	}
	return i.Revision
}
