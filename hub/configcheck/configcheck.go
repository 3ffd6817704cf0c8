// Package configcheck checks a hub configuration file offline, for `hub validate`: whether
// the hub would take it (hub.ParseConfig decides, so the answer is the hub's own), with the
// line of the field an error names, and warnings about what the hub accepts but is likely
// a mistake: hosts several clusters claim, routing rules that select nothing, identities
// that are not SPIFFE IDs of the trust domain, a file without http (no admin API).
//
// It links the hub's configuration parser, so it is not part of the operator's admin-API
// commands (hub/admin, which link only the API's contract).
package configcheck

import (
	"reflect"
	"regexp"
	"strconv"
	"strings"

	"github.com/meshfed/meshfed/hub"
)

// Finding is one error or warning about a file.
type Finding struct {
	// Warning: the hub takes the file; this is likely a mistake. Otherwise an error: the
	// hub refuses the file.
	Warning bool `json:"warning"`
	// Line is the line of the field it is about (0: unknown).
	Line int `json:"line,omitempty"`
	// Message names the field and what is wrong, as the hub says it.
	Message string `json:"message"`
}

// Check checks a configuration file's content: an error when the hub would refuse it
// (the first the hub finds, as it reports it), else the warnings, each with its line where
// the file has it.
func Check(data []byte) []Finding {
	cfg, err := hub.ParseConfig(data)
	if err != nil {
		return []Finding{{Message: err.Error(), Line: errorLine(data, err.Error())}}
	}
	var out []Finding
	for _, w := range warnings(cfg) {
		out = append(out, Finding{Warning: true, Message: w, Line: Line(data, w)})
	}
	return out
}

var (
	yamlLine     = regexp.MustCompile(`\byaml: line (\d+):`)
	unknownField = regexp.MustCompile(`unknown field "([^"]+)"`)
)

// errorLine finds the line an error of ParseConfig is about: a YAML syntax error says it,
// an unknown field is found where the configuration's type has no field of its name, any
// other names its field's path.
func errorLine(data []byte, msg string) int {
	if m := yamlLine.FindStringSubmatch(msg); m != nil {
		n, _ := strconv.Atoi(m[1])
		return n
	}
	if m := unknownField.FindStringSubmatch(msg); m != nil {
		return UnknownKeyLine(data, reflect.TypeFor[hub.Config](), m[1])
	}
	// The path may follow what failed ("acl: invalid configuration: clusters[1] ...").
	for rest := msg; ; {
		if line := Line(data, rest); line > 0 {
			return line
		}
		i := strings.Index(rest, ": ")
		if i < 0 {
			return 0
		}
		rest = rest[i+2:]
	}
}
