package codec

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"strconv"
	"time"

	"github.com/ortbus/ortbus/subjects"
)

// A model changed in place: the gateway that supervises a worker sends it the control
// verbs load and unload (ortbus.worker.<worker>.load|unload, subjects.VerbLoad and
// VerbUnload), and the worker answers each once, with the model's ModelStatus or an Error.

// MaxModelTable bounds WorkerLoad.Table: a model's table is a few hundred bytes (kind,
// dir, files, thresholds, labels).
const MaxModelTable = 64 << 10

// WorkerLoad asks a worker to load one model, or to reload it (load a new copy beside the
// one serving, then swap them): the body of ortbus.worker.<worker>.load.
type WorkerLoad struct {
	// Model is the model's name ([models.NAME]).
	Model string `msgpack:"model" json:"model"`
	// Table is the model's [models.NAME] table as TOML (config.MarshalModel), its dir
	// absolute: the worker does not read its config file again, and validates the table as
	// the config does.
	Table string `msgpack:"table" json:"table"`
	// BudgetBytes is the memory of the worker's device left for this model (0: no limit).
	// A model whose peak passes it fails alone, with code overloaded.
	BudgetBytes int64 `msgpack:"budget_bytes,omitempty" json:"budget_bytes,omitempty"`
	// Order is the pool's models in force, in order: where the model goes among the
	// worker's models (a request without a model takes the first that serves its op).
	Order []string `msgpack:"order,omitempty" json:"order,omitempty"`
	// SentMS and Sig prove the sender (Sign).
	SentMS int64  `msgpack:"sent_unix_ms" json:"sent_unix_ms"`
	Sig    string `msgpack:"sig" json:"sig"`
}

// WorkerUnload asks a worker to unload one model: the body of ortbus.worker.<worker>.unload.
type WorkerUnload struct {
	Model  string `msgpack:"model" json:"model"`
	SentMS int64  `msgpack:"sent_unix_ms" json:"sent_unix_ms"`
	Sig    string `msgpack:"sig" json:"sig"`
}

// ControlSkew bounds how far a signed control body's sent_unix_ms may be from the
// worker's clock.
const ControlSkew = time.Minute

// The sender of load and unload is the gateway that started the worker, which alone
// holds the worker's control key besides the worker (WorkerKey: its own, derived from
// the gateway's key and its id, given to it through the environment,
// config.ControlKeyEnv): a body's sig is the HMAC-SHA256 under that key of the verb, the
// worker's id, every field of the body and its send time, in hex. A body unsigned, signed
// under another key, for another worker or verb, sent more than ControlSkew away from the
// worker's clock, or sent no later than the last body the worker took (a replay; Sent) is
// refused — so on a bus without permissions no one else, another worker included, has a
// worker load files of their choosing, or repeat a load or an unload it heard.

// controlMAC is the signature of a body's fields for verb and worker under key.
func controlMAC(key []byte, verb, worker string, sent int64, fields ...string) string {
	m := hmac.New(sha256.New, key)
	for _, f := range append([]string{verb, worker, strconv.FormatInt(sent, 10)}, fields...) {
		m.Write([]byte(strconv.Itoa(len(f)) + ":" + f + ";"))
	}
	return hex.EncodeToString(m.Sum(nil))
}

func (l *WorkerLoad) fields() []string {
	return append([]string{l.Model, l.Table, strconv.FormatInt(l.BudgetBytes, 10)}, l.Order...)
}

// WorkerKey is the control key of one worker: the HMAC-SHA256 of its id under its
// gateway's key. The gateway gives each worker its own (config.ControlKeyEnv), so that a
// worker, which holds its key, cannot sign for another.
func WorkerKey(gatewayKey []byte, worker string) []byte {
	m := hmac.New(sha256.New, gatewayKey)
	m.Write([]byte("ortbus worker control key\x00" + worker))
	return m.Sum(nil)
}

// MinControlKey is the least length of a worker's control key (a WorkerKey's is 32).
const MinControlKey = 32

// Sent is when the body was signed (its sent_unix_ms): a worker takes a control body
// only if it was sent after the last it took (the gateway's are strictly increasing), so
// that a body heard on the bus cannot be replayed.
func (l *WorkerLoad) Sent() int64 { return l.SentMS }

// Sent is when the body was signed.
func (u *WorkerUnload) Sent() int64 { return u.SentMS }

// Sign signs l for worker under key (the worker's: WorkerKey), sent at sent (unix ms).
func (l *WorkerLoad) Sign(key []byte, worker string, sent int64) {
	l.SentMS = sent
	l.Sig = controlMAC(key, subjects.VerbLoad, worker, l.SentMS, l.fields()...)
}

// Verify checks l's signature for worker under key at now: bad_request naming sig (or
// sent_unix_ms) when it is not the gateway's, unavailable when the worker has no key.
func (l *WorkerLoad) Verify(key []byte, worker string, now time.Time) error {
	return verifyControl(key, l.Sig, controlMAC(key, subjects.VerbLoad, worker, l.SentMS, l.fields()...), l.SentMS, now)
}

// Sign signs u for worker under key (the worker's: WorkerKey), sent at sent (unix ms).
func (u *WorkerUnload) Sign(key []byte, worker string, sent int64) {
	u.SentMS = sent
	u.Sig = controlMAC(key, subjects.VerbUnload, worker, u.SentMS, u.Model)
}

// Verify checks u's signature for worker under key at now.
func (u *WorkerUnload) Verify(key []byte, worker string, now time.Time) error {
	return verifyControl(key, u.Sig, controlMAC(key, subjects.VerbUnload, worker, u.SentMS, u.Model), u.SentMS, now)
}

func verifyControl(key []byte, sig, want string, sent int64, now time.Time) error {
	switch {
	case len(key) < MinControlKey:
		return Errorf(CodeUnavailable, "this worker takes no load or unload: it has no control key (a gateway gives one to the workers it starts)")
	case !hmac.Equal([]byte(sig), []byte(want)):
		return badField("sig", "not signed by this worker's gateway")
	case now.Sub(time.UnixMilli(sent)).Abs() > ControlSkew:
		return badField("sent_unix_ms", "%d is more than %v away from the worker's clock", sent, ControlSkew)
	}
	return nil
}

// Validate checks a load's fields: a model name that is a subject token, a table of at
// most MaxModelTable bytes, a budget not negative, an order of at most MaxHeartbeatList
// names. Errors are bad_request naming the field.
func (l *WorkerLoad) Validate() error {
	if err := subjects.ValidateToken("model", l.Model); err != nil {
		return badField("model", "%v", err)
	}
	if l.Table == "" || len(l.Table) > MaxModelTable {
		return badField("table", "%d bytes, want 1 to %d", len(l.Table), MaxModelTable)
	}
	if l.BudgetBytes < 0 {
		return badField("budget_bytes", "negative")
	}
	if len(l.Order) > MaxHeartbeatList {
		return badField("order", "%d models, over the limit of %d", len(l.Order), MaxHeartbeatList)
	}
	for _, m := range l.Order {
		if err := subjects.ValidateToken("model", m); err != nil {
			return badField("order", "%v", err)
		}
	}
	return nil
}

// Validate checks an unload's model name.
func (u *WorkerUnload) Validate() error {
	if err := subjects.ValidateToken("model", u.Model); err != nil {
		return badField("model", "%v", err)
	}
	return nil
}
