package codec

import (
	"bytes"
	"encoding/json"
	"errors"
	"reflect"
	"testing"

	"github.com/vmihailenco/msgpack/v5"
)

func f64(v float64) *float64 { return &v }

// samples holds one filled-in value of every message type.
func samples() []any {
	served := Served{ID: "r1", Model: "tagger", Pool: "cpu", Worker: "w1", Runtime: "1.30.0", EP: "cpu", Timing: Timing{QueueUS: 1, InferUS: 2, TotalUS: 3}}
	req := Request{V: 1, ID: "r1", Model: "tagger", Path: "/srv/a.png", Class: "batch", Pool: "cuda", Device: "cuda:0", TimeoutMS: 500,
		Thresholds: &Thresholds{General: f64(0.3), Character: f64(0.8)}, Conf: f64(0.25), IoU: f64(0.7), OutPath: "/srv/out.png",
		Feature: FloatVec{1, 2.5, -3}, Candidates: []FloatVec{{1, 2, 3}, {4, 5, 6}},
		Inputs: map[string]*Tensor{"x": {Type: "float32", Shape: []int64{1, 2}, Data: Float32Bytes([]float32{1, 2})}}, Outputs: []string{"y"}}
	return []any{
		&req,
		&WorkItem{Request: req, Op: "tag", DeadlineUnixMS: 123, Attempt: 2, ClaimTo: "ortbus.claim.g", EnqueuedUnixUS: 9},
		&Claim{ID: "r1", Worker: "w1", Pool: "cpu", Attempt: 1, State: ClaimTaken},
		&Cancel{ID: "r1"},
		&TagReply{Served: served, General: map[string]float32{"red": 0.99}, Character: map[string]float32{"hero": 0.9}, Rating: map[string]float32{"general": 0.5}, IPs: []string{"ip"}, IPsMapping: map[string][]string{"hero": {"ip"}}},
		&EmbedReply{Served: served, Dim: 3, Embedding: FloatVec{0.5, -1, 2}},
		&CompareReply{Served: served, Differences: []float32{0.1, 0.4}, Threshold: 0.17, Same: []bool{true, false}},
		&DetectReply{Served: served, Boxes: []Box{{X1: 1, Y1: 2, X2: 3, Y2: 4, Label: "person", Score: 0.9}}},
		&SegmentReply{Served: served, OutPath: "/srv/o.png", Width: 10, Height: 20},
		&InferReply{Served: served, Outputs: map[string]*Tensor{"y": {Type: "int64", Shape: []int64{2}, Data: make([]byte, 16)}}},
		&CancelReply{ID: "r1", Found: true},
		&HealthReply{Status: "ok", Workers: 2, Pools: 1},
		&Heartbeat{V: 1, Worker: "w1", Pool: "cpu", Host: "h", PID: 7, Seq: 9, State: StateReady, Runtime: "1.24.3", EP: "cpu", IntervalMS: 1000,
			Classes: []string{"batch"}, Models: []ModelStatus{{Name: "tagger", Kind: "tagger-pixai", Loaded: true, PeakBytes: 1 << 20, LoadMS: 5}},
			Slots: 2, Queued: map[string]int{"batch": 1}, Running: map[string]int{"batch": 1}, Held: []string{"r1"}, Served: 3, SessionsCreated: 1,
			Error: &Error{Code: CodeRuntimeMissing, Message: "x", Details: map[string]any{"pool": "cpu"}}},
		&StatusReply{Gateway: "g", AllowedRoots: []string{"/srv"}, SpoolDir: "/srv/spool", Pools: []PoolStatus{{Name: "cpu", Classes: []string{"batch"}}},
			Workers: []WorkerStatus{{Heartbeat: Heartbeat{Worker: "w1"}, HeartbeatAgeMS: 5}}, Devices: []DeviceStatus{{Device: "cpu", BudgetBytes: 5}}, Classes: []ClassStatus{{Name: "batch", Chain: []string{"cpu"}}}},
		&Error{Code: CodeNoWorker, Message: "no live pool", Details: map[string]any{"pools": "cpu"}},
		&GatewayBeat{Gateway: "g1", Seq: 3, IntervalMS: 1000},
		&ModelControl{Action: ModelLoad, Model: "tagger", Pool: "cpu"},
		&ReloadReply{Gateway: "g", Changes: "pool cpu: models +tagger", Added: []string{"gpu"}, Removed: []string{"old"}, Replaced: map[string]string{"cuda": "pool table changed"},
			Models: map[string]string{"cpu": "models +tagger"}, Routing: []string{"devices changed"}, Failed: []string{"worker cpu-0@g: model tagger: overloaded"}},
		&WorkerLoad{Model: "tagger", Table: "kind = \"tagger-pixai\"\ndir = \"/srv/m\"\n", BudgetBytes: 1 << 30, Order: []string{"ccip", "tagger"}},
		&WorkerUnload{Model: "tagger"},
		&ModelStatus{Name: "tagger", Kind: "tagger-pixai", State: ModelFailed, Error: &Error{Code: CodeOverloaded, Message: "over budget"}, PeakBytes: 5, LoadMS: 3},
	}
}

func TestRoundTrip(t *testing.T) {
	for _, asJSON := range []bool{false, true} {
		for _, in := range samples() {
			b, err := Encode(in, asJSON)
			if err != nil {
				t.Fatalf("encode %T (json=%v): %v", in, asJSON, err)
			}
			out := reflect.New(reflect.TypeOf(in).Elem()).Interface()
			if err := Decode(b, out, asJSON); err != nil {
				t.Fatalf("decode %T (json=%v): %v", in, asJSON, err)
			}
			// Re-encode both and compare bytes: details maps decode to generic types, so
			// DeepEqual on the structs is too strict while byte equality is exact.
			b2, _ := Encode(out, asJSON)
			if !bytes.Equal(b, b2) {
				t.Fatalf("%T (json=%v) changed in a round trip:\n%s\n%s", in, asJSON, b, b2)
			}
		}
	}
}

func TestFloatVecWire(t *testing.T) {
	want := FloatVec{1.5, -2, 3.25}
	b, _ := Marshal(&EmbedReply{Embedding: want})
	var m map[string]any
	if err := msgpack.Unmarshal(b, &m); err != nil {
		t.Fatal(err)
	}
	if raw, ok := m["embedding"].([]byte); !ok || len(raw) != 12 {
		t.Fatalf("embedding is not a 12-byte bin: %T %v", m["embedding"], m["embedding"])
	}
	// Accepted on input: bin, float32 array, float64 array, integers.
	for name, enc := range map[string]any{
		"bin":     Float32Bytes(want),
		"float32": []float32{1.5, -2, 3.25},
		"float64": []float64{1.5, -2, 3.25},
	} {
		b, _ := msgpack.Marshal(map[string]any{"feature": enc})
		var r Request
		if err := Unmarshal(b, &r); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if !reflect.DeepEqual(r.Feature, want) {
			t.Fatalf("%s: got %v", name, r.Feature)
		}
	}
	b, _ = msgpack.Marshal(map[string]any{"feature": []int{1, 2}})
	var r Request
	if err := Unmarshal(b, &r); err != nil || !reflect.DeepEqual(r.Feature, FloatVec{1, 2}) {
		t.Fatalf("int array: %v %v", r.Feature, err)
	}
	b, _ = msgpack.Marshal(map[string]any{"feature": []byte{1, 2, 3}})
	if err := Unmarshal(b, &r); CodeOf(err) != CodeBadRequest {
		t.Fatalf("3-byte bin accepted: %v", err)
	}
	// JSON: number array both ways.
	j, _ := json.Marshal(&EmbedReply{Embedding: want})
	if !bytes.Contains(j, []byte(`"embedding":[1.5,-2,3.25]`)) {
		t.Fatalf("JSON embedding: %s", j)
	}
}

func TestVersionAndErrors(t *testing.T) {
	b, _ := Marshal(&Request{V: WireVersion + 1, Path: "/x"})
	var r Request
	if err := Unmarshal(b, &r); CodeOf(err) != CodeBadRequest {
		t.Fatalf("future version accepted: %v", err)
	}
	for _, bad := range [][]byte{nil, {0xc1}, {0x81, 0xa2, 'i', 'd'}, []byte("not msgpack at all")} {
		if err := Unmarshal(bad, &r); CodeOf(err) != CodeBadRequest {
			t.Fatalf("%x: %v", bad, err)
		}
	}
	if err := Decode([]byte("{"), &r, true); CodeOf(err) != CodeBadRequest {
		t.Fatalf("bad JSON: %v", err)
	}
	var e *Error
	if !errors.As(error(Errorf(CodeOverloaded, "full")), &e) || e.Code.Status() != 429 {
		t.Fatal("Error is not an error with status 429")
	}
	for _, c := range Codes {
		if !c.Known() || c.Status() < 400 {
			t.Fatalf("code %s: status %d", c, c.Status())
		}
	}
	if CodeOf(errors.New("boom")) != CodeInternal || CodeOf(nil) != "" {
		t.Fatal("CodeOf")
	}
}

func TestTensorJSON(t *testing.T) {
	in := &Tensor{Type: "int64", Shape: []int64{2}, Data: make([]byte, 16)}
	in.Data[0] = 7
	b, err := json.Marshal(in)
	if err != nil || string(b) != `{"type":"int64","shape":[2],"data":[7,0]}` {
		t.Fatalf("%s %v", b, err)
	}
	var out Tensor
	if err := json.Unmarshal(b, &out); err != nil || !bytes.Equal(out.Data, in.Data) {
		t.Fatalf("%v %v", out, err)
	}
	if (&Tensor{Type: "float32", Shape: []int64{3}, Data: make([]byte, 8)}).Validate() == nil {
		t.Fatal("short data accepted")
	}
	if (&Tensor{Type: "complex", Shape: []int64{1}}).Validate() == nil {
		t.Fatal("unknown type accepted")
	}
	// A shape whose element count overflows int64 to 0 is not an empty tensor.
	if (&Tensor{Type: "float32", Shape: []int64{4, 1 << 62}}).Validate() == nil {
		t.Fatal("shape [4, 2^62] with no data accepted (the count wrapped to 0)")
	}
	if (&Tensor{Type: "float32", Shape: []int64{1 << 30, 0}}).Validate() != nil {
		t.Fatal("an empty tensor refused")
	}
}

// TestTensorScalar: a scalar (shape [], one element) is a legitimate tensor, as Silero
// VAD's int64 input "sr" is declared; it validates and keeps its one element through
// msgpack and JSON, in a request's inputs.
func TestTensorScalar(t *testing.T) {
	sr := &Tensor{Type: "int64", Shape: []int64{}, Data: []byte{0x80, 0x3e, 0, 0, 0, 0, 0, 0}} // 16000
	if err := sr.Validate(); err != nil {
		t.Fatalf("scalar refused: %v", err)
	}
	if err := (&Tensor{Type: "int64", Data: sr.Data}).Validate(); err != nil {
		t.Fatalf("scalar with a nil shape refused: %v", err)
	}
	if (&Tensor{Type: "int64", Shape: []int64{}, Data: make([]byte, 16)}).Validate() == nil {
		t.Fatal("a scalar of two elements accepted")
	}
	b, err := Marshal(&Request{Model: "vad", Inputs: map[string]*Tensor{"sr": sr}})
	if err != nil {
		t.Fatal(err)
	}
	var r Request
	if err := Unmarshal(b, &r); err != nil {
		t.Fatal(err)
	}
	if got := r.Inputs["sr"]; got == nil || len(got.Shape) != 0 || !bytes.Equal(got.Data, sr.Data) || got.Validate() != nil {
		t.Fatalf("msgpack round trip: %+v", got)
	}
	j, err := json.Marshal(sr)
	if err != nil || string(j) != `{"type":"int64","shape":[],"data":[16000]}` {
		t.Fatalf("JSON: %s %v", j, err)
	}
	var back Tensor
	if err := json.Unmarshal(j, &back); err != nil || len(back.Shape) != 0 || !bytes.Equal(back.Data, sr.Data) {
		t.Fatalf("JSON round trip: %+v %v", back, err)
	}
}
