// Package golden reads and writes the txtar-style scenario files of the golden tests: a
// comment, then sections that each start with a line "-- name --". Tests compare what they
// compute with a "want" section and rewrite it when run with -update.
//
// It is test infrastructure; nothing in the product imports it.
package golden

import (
	"bytes"
	"flag"
	"os"
	"strings"
)

// Update is set by `go test ... -update`: golden tests rewrite their want sections.
var Update = flag.Bool("update", false, "rewrite the want sections of golden files")

// File is a parsed scenario file.
type File struct {
	Comment  string
	Sections []Section
}

// Section is one "-- name --" part.
type Section struct {
	Name string
	Data string
}

// Parse splits a scenario file into its sections.
func Parse(data []byte) *File {
	f := &File{}
	var cur *Section
	var buf bytes.Buffer
	flush := func() {
		if cur == nil {
			f.Comment = buf.String()
		} else {
			cur.Data = buf.String()
			f.Sections = append(f.Sections, *cur)
		}
		buf.Reset()
	}
	for _, line := range strings.SplitAfter(string(data), "\n") {
		t := strings.TrimRight(line, "\n")
		if strings.HasPrefix(t, "-- ") && strings.HasSuffix(t, " --") && len(t) > 6 {
			flush()
			cur = &Section{Name: strings.TrimSpace(t[3 : len(t)-3])}
			continue
		}
		buf.WriteString(line)
	}
	flush()
	return f
}

// Get returns a section's data, or "" and false.
func (f *File) Get(name string) (string, bool) {
	for _, s := range f.Sections {
		if s.Name == name {
			return s.Data, true
		}
	}
	return "", false
}

// Set replaces (or appends) a section.
func (f *File) Set(name, data string) {
	for i := range f.Sections {
		if f.Sections[i].Name == name {
			f.Sections[i].Data = data
			return
		}
	}
	f.Sections = append(f.Sections, Section{Name: name, Data: data})
}

// Format writes the file back.
func (f *File) Format() []byte {
	var b bytes.Buffer
	b.WriteString(f.Comment)
	for _, s := range f.Sections {
		b.WriteString("-- " + s.Name + " --\n")
		b.WriteString(s.Data)
		if s.Data != "" && !strings.HasSuffix(s.Data, "\n") {
			b.WriteString("\n")
		}
	}
	return b.Bytes()
}

// Check compares got with the file's want section, or rewrites it under -update. It
// returns a non-empty message when they differ.
func Check(path string, f *File, got string) (string, error) {
	want, _ := f.Get("want")
	if *Update {
		if want != got {
			f.Set("want", got)
			return "", os.WriteFile(path, f.Format(), 0o644)
		}
		return "", nil
	}
	if want != got {
		return "--- want\n" + want + "--- got\n" + got, nil
	}
	return "", nil
}
