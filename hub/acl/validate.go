package acl

import (
	"fmt"
	"strings"
)

// Limits of DNS-1123 names.
const (
	maxLabel = 63
	maxName  = 253
)

// checkNamespacePattern returns what is wrong with a namespace pattern, or "".
// Valid: "*", or a DNS-1123 label's characters [a-z0-9-] with an optional trailing "*".
func checkNamespacePattern(p string) string {
	switch {
	case p == "":
		return "empty pattern"
	case p == "*":
		return ""
	}
	body := strings.TrimSuffix(p, "*")
	if body == "" || strings.Contains(body, "*") {
		return `"*" may only end the pattern, or stand alone`
	}
	if len(body) > maxLabel {
		return fmt.Sprintf("longer than %d characters", maxLabel)
	}
	for i := 0; i < len(body); i++ {
		if ch := body[i]; !isLabelChar(ch) {
			return fmt.Sprintf("invalid character %q: namespace patterns use a-z, 0-9 and \"-\"", ch)
		}
	}
	return ""
}

// checkHostPattern returns what is wrong with a host pattern, or "".
// Valid: "*", or a lowercase DNS name (labels of [a-z0-9-], 1–63 characters, starting and
// ending with a letter or digit), optionally prefixed by "*."; no trailing dot.
func checkHostPattern(p string) string {
	switch {
	case p == "":
		return "empty pattern"
	case p == "*":
		return ""
	case p[0] == '*' && (len(p) < 2 || p[1] != '.'):
		return `a wildcard must be "*" or start with "*."`
	}
	name := strings.TrimPrefix(p, "*.")
	if strings.Contains(name, "*") {
		return `"*" may only appear as the whole pattern or in a leading "*."`
	}
	if strings.HasSuffix(name, ".") {
		return `must not end with "."`
	}
	if len(p) > maxName {
		return fmt.Sprintf("longer than %d characters", maxName)
	}
	for label := range strings.SplitSeq(name, ".") {
		if label == "" {
			return "empty label"
		}
		if len(label) > maxLabel {
			return fmt.Sprintf("label %q is longer than %d characters", label, maxLabel)
		}
		for i := 0; i < len(label); i++ {
			ch := label[i]
			if 'A' <= ch && ch <= 'Z' {
				return "must be lowercase"
			}
			if !isLabelChar(ch) {
				return fmt.Sprintf("invalid character %q: host labels use a-z, 0-9 and \"-\"", ch)
			}
		}
		if label[0] == '-' || label[len(label)-1] == '-' {
			return fmt.Sprintf("label %q must start and end with a letter or digit", label)
		}
	}
	return ""
}

func isLabelChar(ch byte) bool {
	return 'a' <= ch && ch <= 'z' || '0' <= ch && ch <= '9' || ch == '-'
}
