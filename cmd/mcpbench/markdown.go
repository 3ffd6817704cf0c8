package main

import (
	"fmt"
	"io"
	"strings"
)

// markdown prints a markdown table row by row (the header's separator after the first),
// so that a row is out as soon as it is measured.
type markdown struct {
	w    io.Writer
	rows int
}

func newMarkdown(w io.Writer) *markdown { return &markdown{w: w} }

func (m *markdown) row(cells ...string) {
	fmt.Fprintf(m.w, "| %s |\n", strings.Join(cells, " | "))
	if m.rows++; m.rows == 1 {
		fmt.Fprintf(m.w, "|%s\n", strings.Repeat("---|", len(cells)))
	}
}
