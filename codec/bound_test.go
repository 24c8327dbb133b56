package codec

import (
	"bytes"
	"fmt"
	"reflect"
	"runtime"
	"strings"
	"testing"
)

// hostileHeaders are length headers at (and near) their maximum, with nothing behind
// them: str, bin, array, map and ext of every width.
var hostileHeaders = [][]byte{
	{0xd9, 0xff}, {0xda, 0xff, 0xff}, {0xdb, 0xff, 0xff, 0xff, 0xff}, {0xdb, 0x7f, 0xff, 0xff, 0xff}, // str8/16/32
	{0xc4, 0xff}, {0xc5, 0xff, 0xff}, {0xc6, 0xff, 0xff, 0xff, 0xff}, {0xc6, 0x80, 0, 0, 0}, // bin8/16/32
	{0xdc, 0xff, 0xff}, {0xdd, 0xff, 0xff, 0xff, 0xff}, {0xdd, 0x7f, 0xff, 0xff, 0xff}, // array16/32
	{0xde, 0xff, 0xff}, {0xdf, 0xff, 0xff, 0xff, 0xff}, {0xdf, 0x00, 0x00, 0x00, 0x02, 0xa1, 'a'}, // map16/32
	{0xc7, 0xff, 0x01}, {0xc8, 0xff, 0xff, 0x01}, {0xc9, 0xff, 0xff, 0xff, 0xff, 0x01}, // ext8/16/32
	{0xd8, 0x01, 0x00}, {0x9f}, {0x8f}, {0xbf}, {0xc1}, // fixext16 truncated, fixarray/fixmap/fixstr truncated, never-used code
}

// Every message type refuses every hostile header, at the top level and as the value of a
// field, with bad_request, and without allocating anything near what the header claims.
func TestBoundedDecodingEveryType(t *testing.T) {
	for _, sample := range samples() {
		typ := reflect.TypeOf(sample).Elem()
		for _, h := range hostileHeaders {
			for _, msg := range [][]byte{h, append([]byte{0x81, 0xaa, 'c', 'a', 'n', 'd', 'i', 'd', 'a', 't', 'e', 's'}, h...),
				append([]byte{0x81, 0xa2, 'i', 'd'}, h...), append([]byte{0x81, 0xa7, 'w', 'o', 'r', 'k', 'e', 'r', 's'}, h...)} {
				v := reflect.New(typ).Interface()
				var before, after runtime.MemStats
				runtime.ReadMemStats(&before)
				err := Unmarshal(msg, v)
				runtime.ReadMemStats(&after)
				if CodeOf(err) != CodeBadRequest {
					t.Fatalf("%s % x: err %v, want bad_request", typ, msg, err)
				}
				if grew := after.TotalAlloc - before.TotalAlloc; grew > 1<<20 {
					t.Fatalf("%s % x: %d bytes allocated for a %d-byte message", typ, msg, grew, len(msg))
				}
			}
		}
	}
}

// The examples: a class of one byte 0xff, a compare whose candidates claim 4
// billion elements (16 bytes), and deep nesting, in msgpack and JSON.
func TestHostileExamples(t *testing.T) {
	class := []byte{0x82, 0xa2, 'i', 'd', 0xa1, 'x', 0xa5, 'c', 'l', 'a', 's', 's', 0xa1, 0xff}
	if err := Unmarshal(class, new(Request)); CodeOf(err) != CodeBadRequest || !strings.Contains(err.Error(), "UTF-8") {
		t.Fatalf("class 0xff: %v", err)
	}
	cand := []byte{0x81, 0xaa, 'c', 'a', 'n', 'd', 'i', 'd', 'a', 't', 'e', 's', 0xdd, 0xff, 0xff, 0xff, 0xff}
	if err := Unmarshal(cand[:16], new(WorkItem)); CodeOf(err) != CodeBadRequest {
		t.Fatalf("4-billion candidates (16 bytes): %v", err)
	}
	deep := append(bytes.Repeat([]byte{0x91}, 100000), 0xc0)
	if err := Unmarshal(deep, new(Request)); CodeOf(err) != CodeBadRequest || !strings.Contains(err.Error(), "deeper") {
		t.Fatalf("deep msgpack: %v", err)
	}
	deepJSON := []byte(`{"inputs":` + strings.Repeat("[", 100000) + strings.Repeat("]", 100000) + `}`)
	if err := Decode(deepJSON, new(Request), true); CodeOf(err) != CodeBadRequest || !strings.Contains(err.Error(), "deeper") {
		t.Fatalf("deep JSON: %v", err)
	}
	if err := Decode([]byte("{\"id\":\"a\xffb\"}"), new(Request), true); CodeOf(err) != CodeBadRequest {
		t.Fatalf("JSON not UTF-8: %v", err)
	}
	// Brackets inside strings are not nesting.
	if err := Decode([]byte(`{"path":"/a/`+strings.Repeat("[", 100)+`\"x.png"}`), new(Request), true); err != nil {
		t.Fatalf("brackets in a string: %v", err)
	}
	if err := Unmarshal(append(mustMarshal(t, &Cancel{ID: "x"}), 0xc0), new(Cancel)); CodeOf(err) != CodeBadRequest {
		t.Fatalf("trailing bytes: %v", err)
	}
}

// Every valid message passes the walk: the samples, re-encoded, decode as before.
func TestBoundWalkAcceptsEverySample(t *testing.T) {
	for _, s := range samples() {
		b := mustMarshal(t, s)
		if err := checkMsgpack(b); err != nil {
			t.Fatalf("%T: %v", s, err)
		}
	}
}

func mustMarshal(t *testing.T, v any) []byte {
	t.Helper()
	b, err := Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func TestRequestValidate(t *testing.T) {
	nan, two := 0.0, 2.0
	nan = nan / nan * 0
	for name, r := range map[string]Request{
		"id with dot":                 {ID: "a.b"},
		"id with space":               {ID: "a b"},
		"id too long":                 {ID: strings.Repeat("x", MaxIDLen+1)},
		"id not ascii":                {ID: "é"},
		"model too long":              {Model: strings.Repeat("m", MaxIDLen+1)},
		"path NUL":                    {Path: "/a\x00b"},
		"out_path NUL":                {OutPath: "/a\x00b"},
		"path too long":               {Path: "/" + strings.Repeat("p", MaxPathLen)},
		"negative timeout":            {TimeoutMS: -1},
		"conf 2":                      {Conf: &two},
		"iou NaN":                     {IoU: &nan},
		"threshold NaN":               {Thresholds: &Thresholds{General: &nan}},
		"null input":                  {Inputs: map[string]*Tensor{"x": nil}},
		"input path NUL":              {InputPaths: map[string]string{"x": "/a\x00b"}},
		"input path empty":            {InputPaths: map[string]string{"x": ""}},
		"input path long":             {InputPaths: map[string]string{"x": "/" + strings.Repeat("p", MaxPathLen)}},
		"input name long":             {InputPaths: map[string]string{strings.Repeat("x", MaxIDLen+1): "/a.npy"}},
		"input paths many":            {InputPaths: manyPaths(MaxTensorPaths + 1)},
		"output paths many":           {OutputPaths: manyPaths(MaxTensorPaths + 1)},
		"output path NUL":             {OutputPaths: map[string]string{"y": "/a\x00b"}},
		"output_dir NUL":              {OutputDir: "/a\x00b"},
		"output_dir and output_paths": {OutputDir: "/spool", OutputPaths: map[string]string{"y": "/spool/y.npy"}},
	} {
		if err := r.Validate(); CodeOf(err) != CodeBadRequest {
			t.Fatalf("%s: %v", name, err)
		}
	}
	ok := Request{ID: "req-1_A:b", Model: "tagger", Path: "/srv/a.png", TimeoutMS: 5}
	if err := ok.Validate(); err != nil {
		t.Fatal(err)
	}
	byPath := Request{InputPaths: manyPaths(MaxTensorPaths), OutputPaths: manyPaths(MaxTensorPaths)}
	if err := byPath.Validate(); err != nil {
		t.Fatal(err)
	}
}

// manyPaths is a map of n tensor names to paths.
func manyPaths(n int) map[string]string {
	m := map[string]string{}
	for i := range n {
		m[fmt.Sprint("t", i)] = fmt.Sprintf("/srv/t%d.npy", i)
	}
	return m
}

// BenchmarkBoundWalk measures what the bounds walk adds to decoding: the walk alone
// against the whole Unmarshal (walk + decode) of a tag work item and of a compare request
// with 100 CCIP candidates (768 float32 each, as bin).
func BenchmarkBoundWalk(b *testing.B) {
	tag := &WorkItem{Request: Request{ID: "r-0123456789", Model: "tagger", Path: "/srv/images/2026/12/photo-0001.png", Class: "batch", TimeoutMS: 30000},
		Op: "tag", DeadlineUnixMS: 1 << 40, Attempt: 1, ClaimTo: "ortbus.claim.gw-1", EnqueuedUnixUS: 1 << 50}
	cmp := &Request{ID: "r-1", Feature: make(FloatVec, 768)}
	for i := 0; i < 100; i++ {
		cmp.Candidates = append(cmp.Candidates, make(FloatVec, 768))
	}
	for _, c := range []struct {
		name string
		msg  any
		into func() any
	}{{"tag", tag, func() any { return new(WorkItem) }}, {"compare100", cmp, func() any { return new(Request) }}} {
		data, err := Marshal(c.msg)
		if err != nil {
			b.Fatal(err)
		}
		b.Run("walk/"+c.name, func(b *testing.B) {
			b.SetBytes(int64(len(data)))
			for i := 0; i < b.N; i++ {
				if err := checkMsgpack(data); err != nil {
					b.Fatal(err)
				}
			}
		})
		b.Run("unmarshal/"+c.name, func(b *testing.B) {
			b.SetBytes(int64(len(data)))
			for i := 0; i < b.N; i++ {
				if err := Unmarshal(data, c.into()); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
