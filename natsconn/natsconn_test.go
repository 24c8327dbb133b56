package natsconn

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/nats-io/nats.go"

	"github.com/ortbus/ortbus/config"
)

func TestStripUserInfo(t *testing.T) {
	for in, want := range map[string]string{
		"nats://127.0.0.1:4222":                      "nats://127.0.0.1:4222",
		"tls://gateway:pw@app.lan:4222":              "tls://app.lan:4222",
		"tls://gateway:p%40w@a:1, tls://b:2,c:d@e:3": "tls://a:1,tls://b:2,e:3",
		"nats://token@host:4222/x?y=z@w":             "nats://host:4222/x?y=z@w",
		"nats://u:raw@pass@host:4222":                "nats://host:4222",
		"":                                           "",
	} {
		if got := StripUserInfo(in); got != want {
			t.Errorf("StripUserInfo(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestOptionsInboxPrefixAndPasswordFile(t *testing.T) {
	pw := filepath.Join(t.TempDir(), "pw")
	if err := os.WriteFile(pw, []byte("secret\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	opts, err := Options(config.NATS{User: "worker-cpu", PasswordFile: pw, InboxPrefix: "_INBOX_gateway"}, "test")
	if err != nil {
		t.Fatal(err)
	}
	var o nats.Options
	for _, f := range opts {
		if err := f(&o); err != nil {
			t.Fatal(err)
		}
	}
	if o.User != "worker-cpu" || o.Password != "secret" || o.InboxPrefix != "_INBOX_gateway" {
		t.Fatalf("options: user %q password %q inbox prefix %q", o.User, o.Password, o.InboxPrefix)
	}
	t.Setenv(PasswordEnv, "")
	if _, err := Options(config.NATS{User: "gateway"}, "test"); err == nil {
		t.Fatal("a user without a password was accepted")
	}
}

// TestReconnectSettings: Options carries the one set of reconnect settings (Reconnect),
// and keeps nats.go's abort on a repeated authorization error.
func TestReconnectSettings(t *testing.T) {
	opts, err := Options(config.NATS{}, "test")
	if err != nil {
		t.Fatal(err)
	}
	for name, set := range map[string][]nats.Option{"Options": opts, "Reconnect": Reconnect()} {
		o := nats.GetDefaultOptions()
		for _, f := range set {
			if err := f(&o); err != nil {
				t.Fatal(err)
			}
		}
		if o.MaxReconnect != -1 || o.ReconnectWait != ReconnectWait || o.ReconnectJitter != ReconnectJitter ||
			o.ReconnectJitterTLS != ReconnectJitterTLS || o.ReconnectBufSize != ReconnectBufSize || o.IgnoreAuthErrorAbort {
			t.Errorf("%s: max reconnects %d, wait %v, jitter %v/%v, buffer %d, ignore auth error abort %v", name,
				o.MaxReconnect, o.ReconnectWait, o.ReconnectJitter, o.ReconnectJitterTLS, o.ReconnectBufSize, o.IgnoreAuthErrorAbort)
		}
	}
}
