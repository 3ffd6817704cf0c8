package minion

import (
	"regexp"
	"strconv"
	"strings"
)

var protojsonPos = regexp.MustCompile(`\(line (\d+):\d+\): (.*)$`)

// explainJSONError rewrites a protojson error about indented (one value per line) JSON as
// "<path>: <reason>", e.g. spec.http[0].timeout: invalid google.protobuf.Duration value "x".
// It returns msg unchanged when it cannot place it.
func explainJSONError(prefix string, indented []byte, msg string) string {
	m := protojsonPos.FindStringSubmatch(msg)
	if m == nil {
		return msg
	}
	line, _ := strconv.Atoi(m[1])
	path := jsonPathAt(string(indented), line)
	if path == "" {
		return prefix + ": " + m[2]
	}
	return prefix + "." + path + ": " + m[2]
}

// jsonPathAt returns the path of the value on line n (1-based) of JSON produced by
// json.MarshalIndent, e.g. "http[0].timeout".
func jsonPathAt(indented string, n int) string {
	type frame struct {
		label string
		array bool
		index int
	}
	var stack []frame
	lines := strings.Split(indented, "\n")
	for i := 0; i < len(lines) && i < n; i++ {
		t := strings.TrimSuffix(strings.TrimSpace(lines[i]), ",")
		if t == "" {
			continue
		}
		if t[0] == '}' || t[0] == ']' {
			if len(stack) > 0 {
				stack = stack[:len(stack)-1]
			}
			continue
		}
		label, value := "", t
		if len(stack) > 0 && stack[len(stack)-1].array {
			top := &stack[len(stack)-1]
			top.index++
			label = "[" + strconv.Itoa(top.index) + "]"
		} else if t[0] == '"' {
			if k, v, ok := splitKey(t); ok {
				label, value = k, v
			}
		}
		open := value == "{" || value == "["
		if i == n-1 {
			parts := make([]string, 0, len(stack)+1)
			for _, f := range stack {
				parts = append(parts, f.label)
			}
			parts = append(parts, label)
			return joinPath(parts)
		}
		if open {
			stack = append(stack, frame{label: label, array: value == "[", index: -1})
		}
	}
	return ""
}

// splitKey splits `"key": value` into key and value.
func splitKey(t string) (string, string, bool) {
	k, err := strconv.QuotedPrefix(t)
	if err != nil {
		return "", "", false
	}
	rest := strings.TrimSpace(strings.TrimPrefix(t[len(k):], ":"))
	key, _ := strconv.Unquote(k)
	return key, rest, true
}

func joinPath(parts []string) string {
	var b strings.Builder
	for _, p := range parts {
		if p == "" {
			continue
		}
		if b.Len() > 0 && !strings.HasPrefix(p, "[") {
			b.WriteByte('.')
		}
		b.WriteString(p)
	}
	return b.String()
}
