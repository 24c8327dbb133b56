package hostile

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
)

// jentry is one member of a JSON object, in document order, as raw text.
type jentry struct {
	name string
	val  json.RawMessage
}

// splitObject splits a JSON object into its members in order; ok is false when b is not
// an object.
func splitObject(b []byte) (entries []jentry, ok bool, err error) {
	b = bytes.TrimSpace(b)
	if len(b) == 0 || b[0] != '{' {
		return nil, false, nil
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.UseNumber()
	if _, err := dec.Token(); err != nil { // {
		return nil, true, err
	}
	for dec.More() {
		t, err := dec.Token()
		if err != nil {
			return nil, true, err
		}
		k, isStr := t.(string)
		if !isStr {
			return nil, true, fmt.Errorf("JSON key %v is not a string", t)
		}
		var raw json.RawMessage
		if err := dec.Decode(&raw); err != nil {
			return nil, true, err
		}
		entries = append(entries, jentry{name: k, val: raw})
	}
	if _, err := dec.Token(); err != nil { // }
		return nil, true, err
	}
	return entries, true, nil
}

// splitJSONArray splits a JSON array into its elements.
func splitJSONArray(b []byte) (elems []json.RawMessage, ok bool, err error) {
	b = bytes.TrimSpace(b)
	if len(b) == 0 || b[0] != '[' {
		return nil, false, nil
	}
	var out []json.RawMessage
	if err := json.Unmarshal(b, &out); err != nil {
		return nil, true, err
	}
	return out, true, nil
}

// joinObject writes members as a JSON object, keys escaped by encoding/json unless raw
// keys are given (rawKeys[i] != "" is written as is, quotes included).
func joinObject(entries []jentry, rawKeys []string) []byte {
	return joinObjectLong(entries, rawKeys, -1, longVal{})
}

// joinObjectLong is joinObject with the value of member i (when 0 <= i) replaced by v,
// in one allocation.
func joinObjectLong(entries []jentry, rawKeys []string, i int, v longVal) []byte {
	keys := make([][]byte, len(entries))
	size := 2
	for k, e := range entries {
		if rawKeys != nil && rawKeys[k] != "" {
			keys[k] = []byte(rawKeys[k])
		} else {
			keys[k], _ = json.Marshal(e.name)
		}
		size += len(keys[k]) + 2 // ':' and ','
		if k == i {
			size += v.size()
		} else {
			size += len(e.val)
		}
	}
	b := append(make([]byte, 0, size), '{')
	for k, e := range entries {
		if k > 0 {
			b = append(b, ',')
		}
		b = append(b, keys[k]...)
		b = append(b, ':')
		if k == i {
			b = v.appendTo(b)
		} else {
			b = append(b, e.val...)
		}
	}
	return append(b, '}')
}

func joinArray(elems []json.RawMessage) []byte {
	var b bytes.Buffer
	b.WriteByte('[')
	for i, e := range elems {
		if i > 0 {
			b.WriteByte(',')
		}
		b.Write(e)
	}
	b.WriteByte(']')
	return b.Bytes()
}

// jsonKind is the broad type of a raw JSON value.
func jsonKind(v json.RawMessage) string {
	v = bytes.TrimSpace(v)
	if len(v) == 0 {
		return "empty"
	}
	switch c := v[0]; {
	case c == '"':
		return "string"
	case c == '{':
		return "object"
	case c == '[':
		return "array"
	case c == 't' || c == 'f':
		return "bool"
	case c == 'n':
		return "null"
	default:
		return "number"
	}
}

// jsonStr writes s as a JSON string literal. Valid UTF-8 is escaped by encoding/json;
// invalid bytes are written raw (which encoding/json would have replaced).
func jsonStr(s string) json.RawMessage {
	if b, err := json.Marshal(s); err == nil && !strings.ContainsRune(s, '\uFFFD') && validUTF8(s) {
		return b
	}
	var b bytes.Buffer
	b.WriteByte('"')
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c == '"' || c == '\\':
			b.WriteByte('\\')
			b.WriteByte(c)
		case c < 0x20:
			fmt.Fprintf(&b, `\u%04x`, c)
		default:
			b.WriteByte(c)
		}
	}
	b.WriteByte('"')
	return b.Bytes()
}

var errNotObject = errors.New("the sample is not a map/object")
