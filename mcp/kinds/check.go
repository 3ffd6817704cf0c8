package kinds

import (
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
	"sync"
	"unicode/utf8"

	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"
	_ "google.golang.org/protobuf/types/known/structpb" // registers Struct: kinds without a message type
	mcpapi "istio.io/api/mcp/v1alpha1"
	"k8s.io/apimachinery/pkg/util/validation"
)

// typeURLPrefix is the one type URL prefix a body may have. Every MCP publisher writes it
// (Go's anypb and gogo's types.MarshalAny, so the minion and Istio's own sources); protobuf
// would resolve any prefix, but one spelling per kind keeps "which message is this" a string
// comparison for every sink the hub serves.
const typeURLPrefix = "type.googleapis.com/"

// structName is the body of a kind without a message type: the minion sends such an object's
// content (every top-level field but apiVersion, kind, metadata and status) as a Struct.
const structName = protoreflect.FullName("google.protobuf.Struct")

// maxDepth bounds how deeply a body's messages nest, counting across the Any values inside
// it: protobuf's own unmarshal limit (10,000, per Unmarshal call) does not see through an
// Any's bytes, so without a total an Any nested in an Any ... could recurse without bound.
const maxDepth = 10000

// maxAnys bounds how many Any values nest inside a body. Each level is decoded from its
// enclosing level's bytes, copied again, so the cost grows with the square of the nesting:
// 10,000 levels in half a megabyte took 1.6 s. Configuration nests a few (an Envoy filter's
// typed config inside another's); 16 keeps a body's cost under 16 decodes of its size.
const maxAnys = 16

// bodyType is what Check expects of a kind's bodies.
type bodyType struct {
	mt      protoreflect.MessageType
	typeURL string // typeURLPrefix + the message's full name
	// what names the message in errors: the message, and for a Struct why it is one.
	what string
}

// newBodyType resolves k's body message: its MessageType, or Struct without one.
// Kind.Validate has checked that a configured message type is registered.
func newBodyType(k Kind) (bodyType, error) {
	name := protoreflect.FullName(k.MessageType)
	what := string(name) + " (the message of " + kindGroup(k) + ")"
	if name == "" {
		name = structName
		what = string(name) + " (" + kindGroup(k) + " has no message type: its content travels as a Struct)"
	}
	mt, err := protoregistry.GlobalTypes.FindMessageByName(name)
	if err != nil {
		return bodyType{}, fmt.Errorf("collection %s: message type %s: %w", k.Collection, name, err)
	}
	return bodyType{mt: mt, typeURL: typeURLPrefix + string(name), what: what}, nil
}

// Check tells whether r, received from a publisher for collection, is a resource of that
// collection's kind that every sink can take as it is. nil means it is; an error names what
// is wrong with it and the rule it breaks. Check is pure and safe for concurrent use: it is
// meant for the hub's ingest, on every resource of every push, before the ownership ACL.
//
// The rules, in the order checked (the first broken one is the error):
//
//   - the collection is in the table, and r and r.metadata are present;
//   - metadata.name is "namespace/name" for a namespaced kind and "name" for a
//     cluster-scoped one (Kind.ClusterScoped), as Kubernetes names them: the namespace a
//     DNS-1123 label (at most 63 characters), the name a DNS-1123 subdomain (at most 253),
//     the rule the apiserver applies to every custom resource's name;
//   - the resource and its metadata carry no field this version of the MCP protos does not
//     know, their strings are UTF-8, and the creation time is one protobuf's Timestamp can
//     hold;
//   - r.body is present, and its type URL is exactly type.googleapis.com/ followed by the
//     kind's message (Kind.MessageType), or google.protobuf.Struct for a kind without one;
//   - the body decodes as that message: valid wire format, valid UTF-8 in strings;
//   - the decoded body keeps nothing unknown, at any depth: no unknown field (protobuf
//     keeps those rather than failing, and the hub would serve bytes it never checked), no
//     enum number the enum does not declare (a proto3 enum keeps any number: the same hole);
//     an Any inside it has a type this program links and is checked the same way (at most
//     16 nested, 10,000 messages deep in all);
//   - every value is one a Kubernetes object could hold, since each body stands for one
//     (a spec, or an object's content): no NaN or infinite number, no Duration or
//     Timestamp outside protobuf's documented range (their JSON forms cannot express them).
//
// A body is not re-encoded: the hub serves the publisher's bytes, so Check accepts any
// valid encoding of an acceptable message (field order, packing, repeated scalars).
func (t *Table) Check(collection string, r *mcpapi.Resource) error {
	_, err := t.Decode(collection, r)
	return err
}

// Decode is Check, returning the body it decoded (of the kind's message type, or a Struct)
// so that a caller reading the body (the hub's ACL reads the hosts it claims) does not
// decode it again. The message is the caller's.
func (t *Table) Decode(collection string, r *mcpapi.Resource) (proto.Message, error) {
	i, ok := t.byColl[collection]
	if !ok {
		return nil, fmt.Errorf("collection %s is not in the kinds table", quote(collection))
	}
	k, bt := t.kinds[i], t.bodies[i]
	if r == nil {
		return nil, errors.New("resource is nil")
	}
	md := r.GetMetadata()
	if md == nil {
		return nil, errors.New("metadata is missing")
	}
	if err := checkName(k, md.GetName()); err != nil {
		return nil, fmt.Errorf("name %s: %w", quote(md.GetName()), err)
	}
	if err := checkEnvelope(r); err != nil {
		return nil, err
	}
	body := r.GetBody()
	if body == nil {
		return nil, fmt.Errorf("body: missing: a %s resource carries %s", k.Kind, bt.what)
	}
	if body.GetTypeUrl() != bt.typeURL {
		return nil, fmt.Errorf("body: type URL %s is not %s", quote(body.GetTypeUrl()), bt.what)
	}
	m, err := checkBody(bt.mt, body.GetValue(), 0, 0)
	if err != nil {
		return nil, fmt.Errorf("body%s", err.prefixed(": "))
	}
	return m, nil
}

// checkName checks a resource name against k's scope and Kubernetes' rules.
func checkName(k Kind, name string) error {
	if name == "" {
		return errors.New("empty: every resource has a name")
	}
	if k.ClusterScoped {
		if strings.Contains(name, "/") {
			return fmt.Errorf("%s is cluster-scoped: a name without a namespace, not \"namespace/name\"", kindGroup(k))
		}
		return checkPart("name", name, validation.DNS1123SubdomainMaxLength, validation.IsDNS1123Subdomain, "a DNS-1123 subdomain")
	}
	ns, n, ok := strings.Cut(name, "/")
	switch {
	case !ok:
		return fmt.Errorf("%s is namespaced: want \"namespace/name\"", kindGroup(k))
	case strings.Contains(n, "/"):
		return fmt.Errorf("more than one \"/\": %s is namespaced, want \"namespace/name\"", kindGroup(k))
	}
	if err := checkPart("namespace", ns, validation.DNS1123LabelMaxLength, validation.IsDNS1123Label, "a DNS-1123 label"); err != nil {
		return err
	}
	return checkPart("name", n, validation.DNS1123SubdomainMaxLength, validation.IsDNS1123Subdomain, "a DNS-1123 subdomain")
}

// checkPart checks one part of a name (what: namespace or name) with Kubernetes' validator.
// A part over limit is refused by its length alone: the validator would also run its regular
// expression over however many bytes a publisher sent.
func checkPart(what, s string, limit int, valid func(string) []string, rule string) error {
	if s == "" {
		return fmt.Errorf("%s is empty", what)
	}
	var problems []string
	if len(s) > limit {
		problems = []string{validation.MaxLenError(limit)}
	} else {
		problems = valid(s)
	}
	if len(problems) == 0 {
		return nil
	}
	return fmt.Errorf("%s %s is not %s: %s", what, quote(s), rule, strings.Join(problems, "; "))
}

// checkEnvelope checks the resource and its metadata, not the body (Check does that with
// the kind's message): unknown fields, UTF-8 and the creation time. The metadata is a
// known Go type, so it is read directly rather than walked.
func checkEnvelope(r *mcpapi.Resource) error {
	if u := r.ProtoReflect().GetUnknown(); len(u) > 0 {
		return fmt.Errorf("resource: %s", unknownFields(r.ProtoReflect().Descriptor(), u))
	}
	md := r.GetMetadata()
	if u := md.ProtoReflect().GetUnknown(); len(u) > 0 {
		return fmt.Errorf("metadata: %s", unknownFields(md.ProtoReflect().Descriptor(), u))
	}
	// Unmarshal has checked the strings of a decoded resource; not of one built in Go.
	if !utf8.ValidString(md.GetVersion()) {
		return errors.New("metadata.version: not valid UTF-8")
	}
	if err := checkStringMap("labels", md.GetLabels()); err != nil {
		return err
	}
	if err := checkStringMap("annotations", md.GetAnnotations()); err != nil {
		return err
	}
	if ct := md.GetCreateTime(); ct != nil {
		if u := ct.ProtoReflect().GetUnknown(); len(u) > 0 {
			return fmt.Errorf("metadata.createTime: %s", unknownFields(ct.ProtoReflect().Descriptor(), u))
		}
		if msg := timestampProblem(ct.GetSeconds(), int64(ct.GetNanos())); msg != "" {
			return fmt.Errorf("metadata.createTime: %s", msg)
		}
	}
	return nil
}

// checkStringMap checks that a metadata map's keys and values are UTF-8; of several bad
// entries it names the one with the least key, so that an error does not vary with map order.
func checkStringMap(field string, m map[string]string) error {
	bad, found := "", false
	for k, v := range m {
		if (!utf8.ValidString(k) || !utf8.ValidString(v)) && (!found || k < bad) {
			bad, found = k, true
		}
	}
	if !found {
		return nil
	}
	return fmt.Errorf("metadata.%s[%s]: not valid UTF-8", field, quote(bad))
}

// checkBody decodes b as mt strictly and walks what it decoded. depth counts the messages
// above it (see maxDepth), anys the Any values (see maxAnys).
func checkBody(mt protoreflect.MessageType, b []byte, depth, anys int) (proto.Message, *fieldError) {
	if depth >= maxDepth { // and RecursionLimit 0 would mean protobuf's default
		return nil, &fieldError{msg: fmt.Sprintf("nested more than %d messages deep", maxDepth)}
	}
	m := mt.New()
	// Every check at once: a lazily decoded field would defer its wire format check to
	// whoever reads it next, a sink's decoder.
	opts := proto.UnmarshalOptions{RecursionLimit: maxDepth - depth, NoLazyDecoding: true}
	if err := opts.Unmarshal(b, m.Interface()); err != nil {
		return nil, &fieldError{msg: fmt.Sprintf("does not decode as %s: %s", mt.Descriptor().FullName(), protoText(err))}
	}
	if err := checkMessage(m, depth, anys); err != nil {
		return nil, err
	}
	return m.Interface(), nil
}

// fieldError is a problem at a path inside a message. The path is collected while the walk
// unwinds (innermost first), so a message that passes costs no path at all.
type fieldError struct {
	path []string // innermost first: "[2]", "route", "[0]", "http"
	msg  string
}

// prefixed is the error after a prefix: sep and the path when there is one, then ": " and
// the problem ("body" + ": http[0]: ...").
func (e *fieldError) prefixed(sep string) string {
	if len(e.path) == 0 {
		return ": " + e.msg
	}
	return sep + e.Error()
}

func (e *fieldError) Error() string {
	var b strings.Builder
	for i := len(e.path) - 1; i >= 0; i-- {
		s := e.path[i]
		if b.Len() > 0 && !strings.HasPrefix(s, "[") {
			b.WriteByte('.')
		}
		b.WriteString(s)
	}
	if b.Len() == 0 {
		return e.msg
	}
	return b.String() + ": " + e.msg
}

func (e *fieldError) at(seg string) *fieldError {
	e.path = append(e.path, seg)
	return e
}

// special messages are checked by their own rules rather than field by field.
type special int

const (
	ordinary special = iota
	duration
	timestamp
	anyMessage
)

// plan is what the walk looks at in a message of one type: its special rule, and the fields
// whose values can hold a problem. The others (numbers other than floats, bools, bytes,
// strings Unmarshal has checked) cannot, and reading them through protoreflect would cost a
// conversion, often an allocation, each: visiting every field, BenchmarkCheck took twice
// the time (16 µs) and allocations (70).
type plan struct {
	special special
	fields  []protoreflect.FieldDescriptor
	// extensions: the message has extension ranges, so populated extensions are walked too.
	extensions bool
}

// plans caches a plan per message descriptor, built on first use: a body's types are the
// kinds' messages and whatever their Any values hold, which only decoding reveals. Plans
// never change; two goroutines building one at once build the same.
var plans sync.Map // protoreflect.MessageDescriptor -> *plan

func planOf(md protoreflect.MessageDescriptor) *plan {
	if p, ok := plans.Load(md); ok {
		return p.(*plan)
	}
	p := &plan{extensions: md.ExtensionRanges().Len() > 0}
	switch md.FullName() {
	case "google.protobuf.Duration":
		p.special = duration
	case "google.protobuf.Timestamp":
		p.special = timestamp
	case "google.protobuf.Any":
		p.special = anyMessage
	}
	fields := md.Fields()
	for i := range fields.Len() {
		if fd := fields.Get(i); needsLook(fd) {
			p.fields = append(p.fields, fd)
		}
	}
	actual, _ := plans.LoadOrStore(md, p)
	return actual.(*plan)
}

// needsLook tells whether a field's values can break a rule Unmarshal does not check.
func needsLook(fd protoreflect.FieldDescriptor) bool {
	if fd.IsMap() {
		return needsLook(fd.MapKey()) || needsLook(fd.MapValue())
	}
	switch fd.Kind() {
	case protoreflect.MessageKind, protoreflect.GroupKind, protoreflect.EnumKind,
		protoreflect.DoubleKind, protoreflect.FloatKind:
		return true
	case protoreflect.StringKind:
		return !utf8Checked(fd)
	}
	return false
}

// utf8Checked tells whether Unmarshal has checked a string field's UTF-8: it does for proto3
// strings; a proto2 message's (a configured kind's) and, conservatively, an edition's (a
// feature can turn the check off) are checked by the walk.
func utf8Checked(fd protoreflect.FieldDescriptor) bool {
	return fd.Syntax() == protoreflect.Proto3
}

// checkMessage walks a decoded message: see Check for the rules. depth counts the messages
// above m, across Any values (the Unmarshal that decoded m has bounded it), anys the Any
// values above m. Unmarshal has checked the wire format; what it lets through is looked
// for here: unknown fields, undeclared enum numbers, strings that are not UTF-8 (where
// Unmarshal did not look), non-finite floats, out-of-range Durations and Timestamps, and
// Any values' contents.
func checkMessage(m protoreflect.Message, depth, anys int) *fieldError {
	md := m.Descriptor()
	if u := m.GetUnknown(); len(u) > 0 {
		return &fieldError{msg: unknownFields(md, u)}
	}
	p := planOf(md)
	switch p.special {
	case duration:
		return secondsNanos(m, durationProblem)
	case timestamp:
		return secondsNanos(m, timestampProblem)
	case anyMessage:
		return checkAny(m, depth, anys)
	}
	for _, fd := range p.fields {
		if !m.Has(fd) {
			continue
		}
		if err := checkField(fd, m.Get(fd), depth, anys); err != nil {
			return err.at(fd.JSONName())
		}
	}
	if !p.extensions {
		return nil
	}
	var err *fieldError
	m.Range(func(fd protoreflect.FieldDescriptor, v protoreflect.Value) bool {
		if fd.IsExtension() {
			if err = checkField(fd, v, depth, anys); err != nil {
				err.at("[" + string(fd.FullName()) + "]")
			}
		}
		return err == nil
	})
	return err
}

// checkField checks one populated field: each element of a list, each entry of a map.
func checkField(fd protoreflect.FieldDescriptor, v protoreflect.Value, depth, anys int) *fieldError {
	switch {
	case fd.IsList():
		l := v.List()
		for i := range l.Len() {
			if err := checkValue(fd, l.Get(i), depth, anys); err != nil {
				return err.at("[" + strconv.Itoa(i) + "]")
			}
		}
	case fd.IsMap():
		// A map ranges in random order: of several bad entries the one with the least key
		// is reported, so the same push always gets the same error (it goes into a NACK and
		// the hub's status). Only a map with an error pays for the comparison.
		var err *fieldError
		var errKey string
		v.Map().Range(func(k protoreflect.MapKey, mv protoreflect.Value) bool {
			e := checkValue(fd.MapKey(), k.Value(), depth, anys)
			if e == nil {
				e = checkValue(fd.MapValue(), mv, depth, anys)
			}
			if e != nil && (err == nil || k.String() < errKey) {
				err, errKey = e, k.String()
			}
			return true
		})
		if err != nil {
			return err.at("[" + quote(errKey) + "]")
		}
	default:
		return checkValue(fd, v, depth, anys)
	}
	return nil
}

// checkValue checks one value of field fd (an element, for a list or a map).
func checkValue(fd protoreflect.FieldDescriptor, v protoreflect.Value, depth, anys int) *fieldError {
	switch fd.Kind() {
	case protoreflect.MessageKind, protoreflect.GroupKind:
		return checkMessage(v.Message(), depth+1, anys)
	case protoreflect.EnumKind:
		if fd.Enum().Values().ByNumber(v.Enum()) == nil {
			return &fieldError{msg: fmt.Sprintf("%d is not a value of enum %s", v.Enum(), fd.Enum().FullName())}
		}
	case protoreflect.StringKind:
		if !utf8Checked(fd) && !utf8.ValidString(v.String()) {
			return &fieldError{msg: "not valid UTF-8"}
		}
	case protoreflect.DoubleKind, protoreflect.FloatKind:
		if f := v.Float(); math.IsNaN(f) || math.IsInf(f, 0) {
			return &fieldError{msg: fmt.Sprintf("%v is not a number a Kubernetes object can hold", f)}
		}
	}
	return nil
}

// secondsNanos checks a Duration or Timestamp (fields 1 seconds, 2 nanos) by problem.
func secondsNanos(m protoreflect.Message, problem func(seconds, nanos int64) string) *fieldError {
	f := m.Descriptor().Fields()
	if msg := problem(m.Get(f.ByNumber(1)).Int(), m.Get(f.ByNumber(2)).Int()); msg != "" {
		return &fieldError{msg: msg}
	}
	return nil
}

// The ranges google.protobuf.Duration and Timestamp document (duration.proto,
// timestamp.proto): what their JSON forms, and so a Kubernetes object, can hold.
const (
	maxDurationSeconds = 315_576_000_000 // 10,000 years
	minTimestampSecs   = -62_135_596_800 // 0001-01-01T00:00:00Z
	maxTimestampSecs   = 253_402_300_799 // 9999-12-31T23:59:59Z
)

// durationProblem says what is wrong with a Duration, "" if nothing. durationpb's CheckValid
// says the same, but through an allocated message and with protobuf's unstable spacing.
func durationProblem(seconds, nanos int64) string {
	switch {
	case seconds < -maxDurationSeconds || seconds > maxDurationSeconds:
		return fmt.Sprintf("duration of %d seconds: google.protobuf.Duration holds at most 10,000 years either way (±%d)", seconds, int64(maxDurationSeconds))
	case nanos <= -1e9 || nanos >= 1e9:
		return fmt.Sprintf("duration nanos %d: not within ±999,999,999", nanos)
	case (seconds > 0 && nanos < 0) || (seconds < 0 && nanos > 0):
		return fmt.Sprintf("duration of %d seconds and %d nanos: google.protobuf.Duration's seconds and nanos have one sign", seconds, nanos)
	}
	return ""
}

// timestampProblem says what is wrong with a Timestamp, "" if nothing.
func timestampProblem(seconds, nanos int64) string {
	switch {
	case seconds < minTimestampSecs || seconds > maxTimestampSecs:
		return fmt.Sprintf("timestamp of %d seconds: google.protobuf.Timestamp holds years 0001 to 9999 (%d to %d)", seconds, int64(minTimestampSecs), int64(maxTimestampSecs))
	case nanos < 0 || nanos >= 1e9:
		return fmt.Sprintf("timestamp nanos %d: not within 0 to 999,999,999", nanos)
	}
	return ""
}

// checkAny checks an Any inside a body like a body: same type URL prefix, a type this
// program links (the hub cannot vouch for bytes it cannot decode, and unknown content is
// what Check refuses everywhere else), decoded strictly and walked. No built-in kind has
// one; a configured kind's message may.
func checkAny(m protoreflect.Message, depth, anys int) *fieldError {
	if anys >= maxAnys {
		return &fieldError{msg: fmt.Sprintf("more than %d Any values nested", maxAnys)}
	}
	f := m.Descriptor().Fields()
	url, value := m.Get(f.ByNumber(1)).String(), m.Get(f.ByNumber(2)).Bytes()
	name, ok := strings.CutPrefix(url, typeURLPrefix)
	if !ok {
		return &fieldError{msg: fmt.Sprintf("type URL %s does not start with %s", quote(url), typeURLPrefix)}
	}
	mt, err := protoregistry.GlobalTypes.FindMessageByName(protoreflect.FullName(name))
	if err != nil {
		return &fieldError{msg: fmt.Sprintf("type URL %s: not a message this program knows, so its content cannot be checked", quote(url))}
	}
	// The Any's content continues the path, as protojson writes it: inline, beside "@type".
	_, ferr := checkBody(mt, value, depth+1, anys+1)
	return ferr
}

// unknownFields describes the unknown fields protobuf kept for a message of md: the numbers
// md does not have (the first five), or else a field of md sent with a wire type its type
// does not have (protobuf keeps that as unknown too).
func unknownFields(md protoreflect.MessageDescriptor, b []byte) string {
	var unknown []string
	more := false
	var wrong protoreflect.FieldDescriptor
	var wrongType protowire.Type
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeField(b)
		if n < 0 {
			break
		}
		b = b[n:]
		switch fd := md.Fields().ByNumber(num); {
		case fd != nil:
			if wrong == nil {
				wrong, wrongType = fd, typ
			}
		case len(unknown) == 5:
			more = true
		default:
			unknown = append(unknown, fmt.Sprintf("%d (%s)", num, wireType(typ)))
		}
	}
	switch {
	case len(unknown) == 0 && wrong != nil:
		return fmt.Sprintf("field %d (%s) sent as %s, not as its type (%s) is in %s",
			wrong.Number(), wrong.JSONName(), wireType(wrongType), wrong.Kind(), md.FullName())
	case len(unknown) == 0: // unknown bytes that do not parse: Unmarshal would have failed
		return fmt.Sprintf("unknown fields that do not parse in %s", md.FullName())
	}
	s := ""
	if len(unknown) > 1 || more {
		s = "s"
	}
	if more {
		unknown = append(unknown, "...")
	}
	return fmt.Sprintf("unknown field%s %s: not a field of %s", s, strings.Join(unknown, ", "), md.FullName())
}

func wireType(t protowire.Type) string {
	switch t {
	case protowire.VarintType:
		return "varint"
	case protowire.Fixed32Type:
		return "fixed32"
	case protowire.Fixed64Type:
		return "fixed64"
	case protowire.BytesType:
		return "bytes"
	case protowire.StartGroupType, protowire.EndGroupType:
		return "group"
	}
	return "wire type " + strconv.Itoa(int(t))
}

// protoText is a protobuf error's text with plain spaces: protobuf-go writes its errors with
// randomly chosen non-breaking or doubled spaces (so that nobody matches them), and Check's
// must read the same from every build, as they go into NACKs and the hub's status.
func protoText(err error) string {
	return strings.Join(strings.Fields(err.Error()), " ")
}

// quote quotes a value from the network for an error, at most 100 bytes of it: a name or
// type URL may be as long as a whole push, and the error goes into a NACK and the logs.
func quote(s string) string {
	const limit = 100
	if len(s) <= limit {
		return strconv.Quote(s)
	}
	return strconv.Quote(s[:limit]) + fmt.Sprintf("... (%d bytes)", len(s))
}
