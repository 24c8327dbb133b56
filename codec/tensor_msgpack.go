package codec

import (
	"fmt"

	"github.com/vmihailenco/msgpack/v5"
	"github.com/vmihailenco/msgpack/v5/msgpcode"
)

// A Tensor's msgpack form is the map {type, shape, data} the struct tags say, with one
// exception the tags cannot say: a string tensor's data is an array of str (its Strings),
// every other's is bin (its Data). The bounds walk of bound.go has already checked every
// length against the bytes there are and every str for UTF-8 when these run.

// EncodeMsgpack writes t as {type, shape, data}.
func (t *Tensor) EncodeMsgpack(enc *msgpack.Encoder) error {
	if t == nil {
		return enc.EncodeNil()
	}
	if err := enc.EncodeMapLen(3); err != nil {
		return err
	}
	if err := enc.EncodeString("type"); err != nil {
		return err
	}
	if err := enc.EncodeString(t.Type); err != nil {
		return err
	}
	if err := enc.EncodeString("shape"); err != nil {
		return err
	}
	if err := enc.Encode(t.Shape); err != nil {
		return err
	}
	if err := enc.EncodeString("data"); err != nil {
		return err
	}
	if t.Type != "string" {
		return enc.EncodeBytes(t.Data)
	}
	if err := enc.EncodeArrayLen(len(t.Strings)); err != nil {
		return err
	}
	for _, s := range t.Strings {
		if err := enc.EncodeString(s); err != nil {
			return err
		}
	}
	return nil
}

// DecodeMsgpack reads {type, shape, data} in any order, unknown keys skipped: data as an
// array of str into Strings, as bin (or str, or nil) into Data. Which one the type wants
// is Validate's to check.
func (t *Tensor) DecodeMsgpack(dec *msgpack.Decoder) error {
	n, err := dec.DecodeMapLen()
	if err != nil {
		return err
	}
	*t = Tensor{}
	for range max(n, 0) {
		key, err := dec.DecodeString()
		if err != nil {
			return err
		}
		switch key {
		case "type":
			err = dec.Decode(&t.Type)
		case "shape":
			err = dec.Decode(&t.Shape)
		case "data":
			err = t.decodeData(dec)
		default:
			err = dec.Skip()
		}
		if err != nil {
			return fmt.Errorf("tensor %s: %w", key, err)
		}
	}
	return nil
}

func (t *Tensor) decodeData(dec *msgpack.Decoder) error {
	c, err := dec.PeekCode()
	if err != nil {
		return err
	}
	if !msgpcode.IsFixedArray(c) && c != msgpcode.Array16 && c != msgpcode.Array32 {
		t.Strings = nil
		return dec.Decode(&t.Data)
	}
	n, err := dec.DecodeArrayLen()
	if err != nil {
		return err
	}
	// n is bounded by the walk: at most one element per byte left in the message.
	t.Data, t.Strings = nil, make([]string, n)
	for i := range t.Strings {
		if c, err := dec.PeekCode(); err != nil || !msgpcode.IsString(c) {
			return fmt.Errorf("element %d is not a str", i)
		}
		if t.Strings[i], err = dec.DecodeString(); err != nil {
			return fmt.Errorf("element %d: %w", i, err)
		}
	}
	return nil
}
