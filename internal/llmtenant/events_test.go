package llmtenant

import (
	"bufio"
	"errors"
	"io"
	"strings"
	"testing"
)

func TestDecodeEvent(t *testing.T) {
	ev, err := decodeEvent([]byte(`{"event":"request","id":"a","prompt_tokens":3,"tokens":2,"first_token_ms":1.5,"total_ms":2,"tokens_per_s":900,"stop":"max_tokens","output":[1,2]}`))
	if err != nil || ev.ID != "a" || ev.Tokens != 2 || ev.FirstTokenMS != 1.5 || ev.TokensPerS != 900 || len(ev.Output) != 2 {
		t.Fatalf("request event decoded as %+v, %v", ev, err)
	}
	ev, err = decodeEvent([]byte(`{"event":"error","id":"b","code":"busy","message":"m"}`))
	if err != nil || ev.Code != CodeBusy || ev.ID != "b" {
		t.Fatalf("error event decoded as %+v, %v", ev, err)
	}
	ev, err = decodeEvent([]byte(`{"event":"exit","reason":"stop","status":0}`))
	if err != nil || ev.Reason != "stop" || ev.Status != 0 {
		t.Fatalf("exit event decoded as %+v, %v", ev, err)
	}
	for _, bad := range []string{
		``, `not json`, `[1]`, `{"event":"nope"}`, `{"event":"ready","rss_bytes":-1}`,
		`{"event":"request","tokens_per_s":-3}`, `{"event":"request","tokens":5000}`,
		`{"event":"request","output":` + strings.Repeat("1,", MaxTokens) + `1]}`,
		`{"event":"error","code":7}`, `{"event":"ready","load_ms":1e999}`,
	} {
		if ev, err := decodeEvent([]byte(bad)); err == nil {
			t.Errorf("%.60q decoded as %+v, want an error", bad, ev)
		}
	}
}

// TestReadLine: lines within the limit come back whole, across the reader's buffer; a
// longer one is dropped to its end and the next line still reads.
func TestReadLine(t *testing.T) {
	in := "short\n" + strings.Repeat("a", 40) + "\n" + strings.Repeat("b", 41) + "\nnext\nlast"
	r := bufio.NewReaderSize(strings.NewReader(in), 16)
	want := []struct {
		line string
		err  error
	}{{"short", nil}, {strings.Repeat("a", 40), nil}, {"", errLineTooLong}, {"next", nil}, {"last", nil}, {"", io.EOF}}
	for i, w := range want {
		line, err := readLine(r, 40)
		if string(line) != w.line || !errors.Is(err, w.err) && (err != nil || w.err != nil) {
			t.Fatalf("line %d: %q, %v; want %q, %v", i, line, err, w.line, w.err)
		}
	}
}
