package hub

import (
	"bufio"
	"encoding/json"
	"fmt"
	"os"
	"regexp"
	"strings"
	"testing"
)

// readmeRow is a row of README.md's hub configuration table whose default is a value:
// `field` | `value` [ (`value` without a file) ].
var readmeRow = regexp.MustCompile("^\\| `([a-zA-Z.]+)` \\| (?:`([^`]*)`|off|none|false|true)(?: \\(`([^`]*)` without a file\\))? \\|")

// The README's table of the hub's configuration says what Defaults() and, without a file,
// DefaultConfig() hold: every row whose default is a value (a scalar, or a {key: value}
// section of scalars), checked against the structs as JSON.
func TestREADMEDefaultsAreTheCode(t *testing.T) {
	f, err := os.Open("../README.md")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	defaults, noFile := asJSON(t, Defaults()), asJSON(t, DefaultConfig())
	checked, in := 0, false
	sc := bufio.NewScanner(f)
	for n := 1; sc.Scan(); n++ {
		if strings.HasPrefix(sc.Text(), "## ") {
			in = sc.Text() == "## Hub configuration"
		}
		if !in {
			continue
		}
		m := readmeRow.FindStringSubmatch(sc.Text())
		if m == nil || strings.Contains(m[1], ".") {
			continue
		}
		field, value, withoutFile := m[1], m[2], m[3]
		if value != "" {
			checked++
			if err := same(defaults[field], value); err != nil {
				t.Errorf("README.md:%d: `%s` default `%s`: Defaults() has %s: %v", n, field, value, defaults[field], err)
			}
		}
		if withoutFile != "" {
			checked++
			if err := same(noFile[field], withoutFile); err != nil {
				t.Errorf("README.md:%d: `%s` without a file `%s`: DefaultConfig() has %s: %v", n, field, withoutFile, noFile[field], err)
			}
		}
	}
	if checked < 10 {
		t.Errorf("checked %d defaults: is the table's format changed?", checked)
	}
}

func asJSON(t *testing.T, c *Config) map[string]json.RawMessage {
	b, err := json.Marshal(c)
	if err != nil {
		t.Fatal(err)
	}
	var m map[string]json.RawMessage
	if err := json.Unmarshal(b, &m); err != nil {
		t.Fatal(err)
	}
	return m
}

// same reports whether the README's value (a scalar, or {k: v, ...} of scalars, sizes like
// 512MiB in bytes) is the JSON value got.
func same(got json.RawMessage, value string) error {
	if inner, ok := strings.CutPrefix(value, "{"); ok {
		var obj map[string]json.RawMessage
		if err := json.Unmarshal(got, &obj); err != nil {
			return err
		}
		for _, kv := range strings.Split(strings.TrimSuffix(inner, "}"), ",") {
			k, v, _ := strings.Cut(strings.TrimSpace(kv), ": ")
			if err := same(obj[k], v); err != nil {
				return fmt.Errorf("%s: %w", k, err)
			}
		}
		return nil
	}
	if len(got) == 0 { // omitted: the zero value
		got = json.RawMessage("null")
	}
	dec := json.NewDecoder(strings.NewReader(string(got)))
	dec.UseNumber()
	var g any
	if err := dec.Decode(&g); err != nil {
		return err
	}
	if g == nil {
		g = map[string]string{"0": "0", "false": "false", "": ""}[value] // what README writes for a zero value
	}
	want := value
	for unit, mult := range map[string]int64{"KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30} {
		if n, ok := strings.CutSuffix(value, unit); ok {
			var i int64
			if _, err := fmt.Sscan(n, &i); err == nil {
				want = fmt.Sprint(i * mult)
			}
		}
	}
	if fmt.Sprint(g) != want {
		return fmt.Errorf("the code's %v is not %s", g, value)
	}
	return nil
}
