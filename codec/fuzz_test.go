package codec

import (
	"testing"
)

// seeds are valid encodings of every message plus some hostile shapes; `go test` runs
// them as the fuzz targets' seed corpus, `go test -fuzz FuzzX` explores from them.
func seeds(f *testing.F, asJSON bool) {
	for _, m := range samples() {
		b, err := Encode(m, asJSON)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	for _, s := range [][]byte{{}, {0xc1}, {0xdd, 0xff, 0xff, 0xff, 0xff}, {0xdf, 0x7f, 0xff, 0xff, 0xff}, {0x81, 0xa7, 'f', 'e', 'a', 't', 'u', 'r', 'e', 0xdd, 0x7f, 0, 0, 0},
		[]byte(`{"feature":"x"}`), []byte(`{"inputs":{"x":{"type":"float32","shape":[1],"data":[1e999]}}}`), []byte(`[]`)} {
		f.Add(s)
	}
}

func checkDecodeErr(t *testing.T, err error) {
	if err != nil && CodeOf(err) != CodeBadRequest {
		t.Fatalf("decode error is %q, not bad_request: %v", CodeOf(err), err)
	}
}

func FuzzDecodeRequest(f *testing.F) {
	seeds(f, false)
	f.Fuzz(func(t *testing.T, b []byte) {
		var r WorkItem
		err := Unmarshal(b, &r)
		checkDecodeErr(t, err)
		if err == nil {
			for _, in := range r.Inputs {
				if in != nil {
					_ = in.Validate()
				}
			}
			if _, err := Marshal(&r); err != nil {
				t.Fatalf("decoded request does not re-encode: %v", err)
			}
		}
	})
}

func FuzzDecodeJSONRequest(f *testing.F) {
	seeds(f, true)
	f.Fuzz(func(t *testing.T, b []byte) {
		var r Request
		checkDecodeErr(t, Decode(b, &r, true))
	})
}

func FuzzDecodeHeartbeat(f *testing.F) {
	seeds(f, false)
	f.Fuzz(func(t *testing.T, b []byte) {
		var h Heartbeat
		checkDecodeErr(t, Unmarshal(b, &h))
	})
}

func FuzzDecodeReply(f *testing.F) {
	seeds(f, false)
	f.Fuzz(func(t *testing.T, b []byte) {
		for _, op := range []string{"tag", "embed", "compare", "detect", "segment", "infer", "status"} {
			checkDecodeErr(t, Unmarshal(b, NewReply(op)))
		}
	})
}

// FuzzDecodeControl: the bodies of a worker's load and unload control verbs, msgpack and
// JSON: a decode error is bad_request, and a decoded body validates without a panic.
func FuzzDecodeControl(f *testing.F) {
	seeds(f, false)
	seeds(f, true)
	f.Fuzz(func(t *testing.T, b []byte) {
		for _, asJSON := range []bool{false, true} {
			var l WorkerLoad
			if err := Decode(b, &l, asJSON); err == nil {
				checkDecodeErr(t, l.Validate())
			} else {
				checkDecodeErr(t, err)
			}
			var u WorkerUnload
			if err := Decode(b, &u, asJSON); err == nil {
				checkDecodeErr(t, u.Validate())
			} else {
				checkDecodeErr(t, err)
			}
		}
	})
}
