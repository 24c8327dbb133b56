package codec

import (
	"encoding/json"
	"slices"
	"strings"
	"testing"

	"github.com/vmihailenco/msgpack/v5"
)

// TestStringTensor: a string tensor travels as an array of str in msgpack and of strings
// in JSON, both ways, and every other type's data stays bin.
func TestStringTensor(t *testing.T) {
	in := &Tensor{Type: "string", Shape: []int64{2, 2}, Strings: []string{"", "héllo", "日本語", "a\x00b"}}
	if err := in.Validate(); err != nil {
		t.Fatal(err)
	}
	b, err := Marshal(&InferReply{Outputs: map[string]*Tensor{"y": in}})
	if err != nil {
		t.Fatal(err)
	}
	// The data is a msgpack array of str: decoded generically it is a []any of strings.
	var generic struct {
		Outputs map[string]map[string]any `msgpack:"outputs"`
	}
	if err := msgpack.Unmarshal(b, &generic); err != nil {
		t.Fatal(err)
	}
	if d, ok := generic.Outputs["y"]["data"].([]any); !ok || len(d) != 4 || d[1] != "héllo" {
		t.Fatalf("msgpack data = %#v, want an array of 4 str", generic.Outputs["y"]["data"])
	}
	var rep InferReply
	if err := Unmarshal(b, &rep); err != nil {
		t.Fatal(err)
	}
	got := rep.Outputs["y"]
	if got.Type != "string" || !slices.Equal(got.Shape, in.Shape) || !slices.Equal(got.Strings, in.Strings) || len(got.Data) != 0 {
		t.Fatalf("msgpack round trip = %+v", got)
	}
	if err := got.Validate(); err != nil {
		t.Fatal(err)
	}

	j, err := json.Marshal(in)
	if err != nil {
		t.Fatal(err)
	}
	if want := `{"type":"string","shape":[2,2],"data":["","héllo","日本語","a\u0000b"]}`; string(j) != want {
		t.Fatalf("JSON = %s, want %s", j, want)
	}
	var back Tensor
	if err := json.Unmarshal(j, &back); err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(back.Strings, in.Strings) || back.Validate() != nil {
		t.Fatalf("JSON round trip = %+v", back)
	}
	// A scalar string and an empty one.
	for _, x := range []*Tensor{{Type: "string", Shape: []int64{}, Strings: []string{"one"}}, {Type: "string", Shape: []int64{0, 3}}} {
		b, err := Marshal(x)
		if err != nil {
			t.Fatal(err)
		}
		var y Tensor
		if err := Unmarshal(b, &y); err != nil || y.Validate() != nil || !slices.Equal(y.Strings, x.Strings) {
			t.Fatalf("%+v: round trip %+v, %v", x, y, err)
		}
	}
	// A request whose tensor is nil is still refused as null.
	b, err = Marshal(map[string]any{"inputs": map[string]any{"x": nil}})
	if err != nil {
		t.Fatal(err)
	}
	var req Request
	if err := Unmarshal(b, &req); err != nil {
		t.Fatal(err)
	}
	if err := req.Validate(); err == nil || !strings.Contains(err.Error(), "null") {
		t.Fatalf("null input: %v", err)
	}
}

// TestStringTensorRefusals: Validate refuses a count that is not the shape's, bytes data,
// strings on another type, invalid UTF-8 and more than MaxStringBytes in all; the decoder
// refuses an array of anything but str.
func TestStringTensorRefusals(t *testing.T) {
	big := strings.Repeat("x", 1<<20) // shared: 257 of them are 257 MiB of elements, 1 MiB of memory
	many := make([]string, MaxStringBytes>>20+1)
	for i := range many {
		many[i] = big
	}
	for _, c := range []struct {
		t    Tensor
		want string
	}{
		{Tensor{Type: "string", Shape: []int64{3}, Strings: []string{"a", "b"}}, "needs 3 strings, got 2"},
		{Tensor{Type: "string", Shape: []int64{1}, Strings: []string{"a"}, Data: []byte{1}}, "bytes of data"},
		{Tensor{Type: "uint8", Shape: []int64{1}, Strings: []string{"a"}, Data: []byte{1}}, "its data is bytes"},
		{Tensor{Type: "string", Shape: []int64{2}, Strings: []string{"ok", "\xff"}}, "string 1 of the tensor is not valid UTF-8"},
		{Tensor{Type: "string", Shape: []int64{int64(len(many))}, Strings: many}, "more than 268435456 bytes"},
		{Tensor{Type: "string", Shape: []int64{1 << 20, 1 << 20}}, "more than 268435456 elements"},
	} {
		if err := c.t.Validate(); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s %v: %v, want %q", c.t.Type, c.t.Shape, err, c.want)
		}
	}
	for _, data := range []any{[]any{"a", 1}, []any{[]byte("a")}, []any{nil, "b"}} {
		b, err := msgpack.Marshal(map[string]any{"type": "string", "shape": []int64{2}, "data": data})
		if err != nil {
			t.Fatal(err)
		}
		var x Tensor
		err = Unmarshal(b, &x)
		if err == nil {
			err = x.Validate()
		}
		if err == nil {
			t.Errorf("data %#v: accepted as %+v", data, x)
		}
	}
	// A str that is not UTF-8 never reaches the decoder: the bounds walk refuses it.
	raw := []byte{0x83, 0xa4, 't', 'y', 'p', 'e', 0xa6, 's', 't', 'r', 'i', 'n', 'g', 0xa5, 's', 'h', 'a', 'p', 'e', 0x91, 0x01, 0xa4, 'd', 'a', 't', 'a', 0x91, 0xa1, 0xff}
	var x Tensor
	if err := Unmarshal(raw, &x); err == nil || !strings.Contains(err.Error(), "UTF-8") {
		t.Errorf("invalid UTF-8 str: %v", err)
	}
	raw[len(raw)-1] = 'z'
	if err := Unmarshal(raw, &x); err != nil || x.Validate() != nil || !slices.Equal(x.Strings, []string{"z"}) {
		t.Errorf("valid str: %+v, %v", x, err)
	}
}
