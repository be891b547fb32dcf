package main

// Protobuf wire encoding of the externalgrpc messages, written from the field numbers of the
// upstream .proto (kubernetes/autoscaler,
// cluster-autoscaler/cloudprovider/externalgrpc/protos/externalgrpc.proto), independently of
// our own proto/ so that a wrong number or type in ours shows up here. Decoding follows Go protobuf:
// last scalar wins, repeated message occurrences merge, a known field with an unexpected wire
// type is ignored as unknown. Such anomalies are recorded so the scenario can fail on them.

import (
	"fmt"
	"math"
	"regexp"
	"sort"
	"sync"

	"google.golang.org/protobuf/encoding/protowire"
)

// rawCodec hands already-encoded bytes to gRPC and returns the answer's bytes untouched.
type rawCodec struct{}

func (rawCodec) Marshal(v any) ([]byte, error) {
	p, ok := v.(*[]byte)
	if !ok {
		return nil, fmt.Errorf("rawCodec: cannot marshal %T", v)
	}
	return *p, nil
}

func (rawCodec) Unmarshal(data []byte, v any) error {
	p, ok := v.(*[]byte)
	if !ok {
		return fmt.Errorf("rawCodec: cannot unmarshal into %T", v)
	}
	*p = append([]byte(nil), data...)
	return nil
}

// Name "proto" keeps the content-type application/grpc+proto, as generated clients send.
func (rawCodec) Name() string { return "proto" }

// ---- encoding ----

type enc struct{ b []byte }

func (e *enc) tag(num protowire.Number, typ protowire.Type) {
	e.b = protowire.AppendTag(e.b, num, typ)
}

// proto3 implicit presence: zero values are not written (as Go's generated code does).
func (e *enc) str(num protowire.Number, s string) {
	if s != "" {
		e.tag(num, protowire.BytesType)
		e.b = protowire.AppendString(e.b, s)
	}
}

func (e *enc) int32(num protowire.Number, v int32) {
	if v != 0 {
		e.tag(num, protowire.VarintType)
		e.b = protowire.AppendVarint(e.b, uint64(int64(v))) // negative: 10-byte sign extension
	}
}

func (e *enc) double(num protowire.Number, v float64) {
	if v != 0 || math.Signbit(v) {
		e.tag(num, protowire.Fixed64Type)
		e.b = protowire.AppendFixed64(e.b, math.Float64bits(v))
	}
}

func (e *enc) boolean(num protowire.Number, v bool) {
	if v {
		e.tag(num, protowire.VarintType)
		e.b = protowire.AppendVarint(e.b, 1)
	}
}

func (e *enc) bytes(num protowire.Number, v []byte) {
	if len(v) > 0 {
		e.tag(num, protowire.BytesType)
		e.b = protowire.AppendBytes(e.b, v)
	}
}

// message writes a present sub-message, even when it is empty.
func (e *enc) message(num protowire.Number, v []byte) {
	e.tag(num, protowire.BytesType)
	e.b = protowire.AppendBytes(e.b, v)
}

func (e *enc) strMap(num protowire.Number, m map[string]string) {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		var entry enc
		entry.str(1, k)
		entry.str(2, m[k])
		e.message(num, entry.b)
	}
}

// ---- decoding ----

type field struct {
	typ protowire.Type
	v   uint64
	b   []byte
}

// msg is a parsed message; path names it in anomaly reports ("NodeGroupsResponse.nodeGroups").
type msg struct {
	path   string
	fields map[protowire.Number][]field
}

var (
	anomaliesMu sync.Mutex
	anomalies   []string
	unknownMu   sync.Mutex
	unknown     = map[string]bool{}
)

// knownFields: per message, the field numbers any released CA generation defines (the union
// of 1.34.1, 1.34.5 and 1.36.1). Other fields are ignored by every CA: harmless, but worth
// knowing, since a later upstream proto could give the same number another meaning.
var knownFields = map[string][]protowire.Number{
	"NodeGroupsResponse":                                      {1},
	"NodeGroupsResponse.nodeGroups":                           {1, 2, 3, 4},
	"NodeGroupForNodeResponse":                                {1},
	"NodeGroupForNodeResponse.nodeGroup":                      {1, 2, 3, 4},
	"NodeGroupTargetSizeResponse":                             {1},
	"NodeGroupNodesResponse":                                  {1},
	"NodeGroupNodesResponse.instances":                        {1, 2},
	"NodeGroupNodesResponse.instances.status":                 {1, 2},
	"NodeGroupNodesResponse.instances.status.errorInfo":       {1, 2, 3},
	"NodeGroupTemplateNodeInfoResponse":                       {1, 2},
	"NodeGroupGetOptionsResponse":                             {1},
	"NodeGroupGetOptionsResponse.nodeGroupAutoscalingOptions": {1, 2, 3, 4, 5, 6, 7, 8, 9, 10},
	"GPULabelResponse":                                        {1},
	"GetAvailableGPUTypesResponse":                            {1},
	"PricingNodePriceResponse":                                {1},
	"PricingPodPriceResponse":                                 {1},
}

var indexSuffix = regexp.MustCompile(`\[[0-9]+\]`)

// noteUnknown records fields outside the union schema, once per message and number.
func noteUnknown(path string, num protowire.Number) {
	key := indexSuffix.ReplaceAllString(path, "")
	known, ok := knownFields[key]
	if !ok {
		return
	}
	for _, k := range known {
		if k == num {
			return
		}
	}
	unknownMu.Lock()
	defer unknownMu.Unlock()
	unknown[fmt.Sprintf("%s field %d", key, num)] = true
}

// unknownFields lists what noteUnknown saw.
func unknownFields() []string {
	unknownMu.Lock()
	defer unknownMu.Unlock()
	out := make([]string, 0, len(unknown))
	for k := range unknown {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

func noteAnomaly(format string, args ...any) {
	anomaliesMu.Lock()
	defer anomaliesMu.Unlock()
	anomalies = append(anomalies, fmt.Sprintf(format, args...))
}

// takeAnomalies returns and clears the wire anomalies seen so far.
func takeAnomalies() []string {
	anomaliesMu.Lock()
	defer anomaliesMu.Unlock()
	out := anomalies
	anomalies = nil
	return out
}

func parseMsg(path string, b []byte) (msg, error) {
	m := msg{path: path, fields: map[protowire.Number][]field{}}
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return m, fmt.Errorf("%s: bad tag: %w", path, protowire.ParseError(n))
		}
		b = b[n:]
		f := field{typ: typ}
		switch typ {
		case protowire.VarintType:
			f.v, n = protowire.ConsumeVarint(b)
		case protowire.Fixed64Type:
			f.v, n = protowire.ConsumeFixed64(b)
		case protowire.Fixed32Type:
			var v uint32
			v, n = protowire.ConsumeFixed32(b)
			f.v = uint64(v)
		case protowire.BytesType:
			f.b, n = protowire.ConsumeBytes(b)
		default:
			n = protowire.ConsumeFieldValue(num, typ, b)
		}
		if n < 0 {
			return m, fmt.Errorf("%s: field %d: %w", path, num, protowire.ParseError(n))
		}
		b = b[n:]
		noteUnknown(path, num)
		m.fields[num] = append(m.fields[num], f)
	}
	return m, nil
}

// typed returns the occurrences of num that carry the expected wire type.
func (m msg) typed(num protowire.Number, name string, want protowire.Type) []field {
	var out []field
	for _, f := range m.fields[num] {
		if f.typ != want {
			noteAnomaly("%s.%s (field %d) has wire type %d, expected %d: Go protobuf ignores it",
				m.path, name, num, f.typ, want)
			continue
		}
		out = append(out, f)
	}
	return out
}

func (m msg) last(num protowire.Number, name string, want protowire.Type) (field, bool) {
	fs := m.typed(num, name, want)
	if len(fs) == 0 {
		return field{}, false
	}
	return fs[len(fs)-1], true
}

func (m msg) has(num protowire.Number) bool { return len(m.fields[num]) > 0 }

func (m msg) str(num protowire.Number, name string) string {
	f, _ := m.last(num, name, protowire.BytesType)
	return string(f.b)
}

func (m msg) int32(num protowire.Number, name string) int32 {
	f, _ := m.last(num, name, protowire.VarintType)
	return int32(f.v)
}

func (m msg) int64(num protowire.Number, name string) int64 {
	f, _ := m.last(num, name, protowire.VarintType)
	return int64(f.v)
}

func (m msg) double(num protowire.Number, name string) float64 {
	f, _ := m.last(num, name, protowire.Fixed64Type)
	return math.Float64frombits(f.v)
}

func (m msg) boolean(num protowire.Number, name string) bool {
	f, _ := m.last(num, name, protowire.VarintType)
	return f.v != 0
}

// bytesField is a proto3 bytes field: last occurrence wins, nil when absent or empty.
func (m msg) bytesField(num protowire.Number, name string) []byte {
	f, ok := m.last(num, name, protowire.BytesType)
	if !ok || len(f.b) == 0 {
		return nil
	}
	return f.b
}

// subRaw returns a singular sub-message's bytes (all occurrences concatenated = merged) and
// whether it was present at all.
func (m msg) subRaw(num protowire.Number, name string) ([]byte, bool) {
	fs := m.typed(num, name, protowire.BytesType)
	if len(fs) == 0 {
		return nil, false
	}
	var out []byte
	for _, f := range fs {
		out = append(out, f.b...)
	}
	return out, true
}

func (m msg) sub(num protowire.Number, name string) (msg, bool, error) {
	raw, ok := m.subRaw(num, name)
	if !ok {
		return msg{}, false, nil
	}
	s, err := parseMsg(m.path+"."+name, raw)
	return s, true, err
}

// repeated parses each occurrence of a repeated message field.
func (m msg) repeated(num protowire.Number, name string) ([]msg, error) {
	var out []msg
	for i, f := range m.typed(num, name, protowire.BytesType) {
		s, err := parseMsg(fmt.Sprintf("%s.%s[%d]", m.path, name, i), f.b)
		if err != nil {
			return nil, err
		}
		out = append(out, s)
	}
	return out, nil
}

// mapKeys returns the keys of a map<string, ...> field.
func (m msg) mapKeys(num protowire.Number, name string) ([]string, error) {
	entries, err := m.repeated(num, name)
	if err != nil {
		return nil, err
	}
	keys := make([]string, 0, len(entries))
	for _, e := range entries {
		keys = append(keys, e.str(1, "key"))
	}
	return keys, nil
}
