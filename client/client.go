// Package client is the Go client of the ortbus API (ortbus.v1.<op> over NATS). Each call
// takes a context: its deadline becomes the request's timeout_ms, and cancelling it sends
// ortbus.v1.cancel for the request, so the gateway drops it if queued or has the worker
// stop it if running. Errors from ortbus are *codec.Error with the contract's stable code.
//
// Give every call a deadline. A request is held by the gateway that took it, and only
// that gateway answers it: when it dies, a call without failover (Client.Failover) is
// never answered, and one whose context has no deadline waits for ever. With failover on,
// the call is sent again when its gateway dies (failover.go); the deadline still bounds
// it all.
package client

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nuid"

	"github.com/ortbus/ortbus/codec"
	"github.com/ortbus/ortbus/internal/reply"
	"github.com/ortbus/ortbus/subjects"
)

// Client calls the ortbus API over a NATS connection.
type Client struct {
	nc *nats.Conn
	// Class and Pool are defaults for requests that leave them empty.
	Class string
	Pool  string
	// Failover: follow the gateways' beats and send a waiting request again when the
	// gateway holding it dies (failover.go). MissCount is how many beat intervals of
	// silence make a gateway dead (default 3, the gateways' own health.miss_count by
	// default).
	Failover  bool
	MissCount int

	beatsOnce sync.Once
	beats     *beats
	beatsErr  error
}

// New wraps an existing connection.
func New(nc *nats.Conn) *Client { return &Client{nc: nc} }

// Connect dials NATS at url with opts (credentials, TLS, ...).
//
// A server that gives each user its own inbox prefix (deploy/cluster/permissions.conf: the
// client role may subscribe only to _INBOX_client.>) needs the prefix among opts, or no
// reply can reach the client:
//
//	c, err := client.Connect(url, nats.UserInfo("client", pw), nats.RootCAs(ca),
//		nats.CustomInboxPrefix("_INBOX_client"))
//
// New takes a connection dialled with the same option.
func Connect(url string, opts ...nats.Option) (*Client, error) {
	nc, err := nats.Connect(url, append([]nats.Option{nats.Name("ortbus client"), nats.MaxReconnects(-1)}, opts...)...)
	if err != nil {
		return nil, fmt.Errorf("connect to %s: %w", url, err)
	}
	return New(nc), nil
}

// Conn is the underlying connection.
func (c *Client) Conn() *nats.Conn { return c.nc }

// Close closes the connection.
func (c *Client) Close() {
	c.beats.close()
	c.nc.Close()
}

// Tag tags the image at req.Path.
func (c *Client) Tag(ctx context.Context, req codec.Request) (*codec.TagReply, error) {
	var r codec.TagReply
	return &r, c.Do(ctx, subjects.OpTag, &req, &r)
}

// Embed returns the embedding of the image at req.Path.
func (c *Client) Embed(ctx context.Context, req codec.Request) (*codec.EmbedReply, error) {
	var r codec.EmbedReply
	return &r, c.Do(ctx, subjects.OpEmbed, &req, &r)
}

// Compare returns the differences of req.Feature to each of req.Candidates.
func (c *Client) Compare(ctx context.Context, req codec.Request) (*codec.CompareReply, error) {
	var r codec.CompareReply
	return &r, c.Do(ctx, subjects.OpCompare, &req, &r)
}

// Detect returns the boxes found in the image at req.Path.
func (c *Client) Detect(ctx context.Context, req codec.Request) (*codec.DetectReply, error) {
	var r codec.DetectReply
	return &r, c.Do(ctx, subjects.OpDetect, &req, &r)
}

// Segment writes the image's cut-out as an RGBA PNG and returns its path.
func (c *Client) Segment(ctx context.Context, req codec.Request) (*codec.SegmentReply, error) {
	var r codec.SegmentReply
	return &r, c.Do(ctx, subjects.OpSegment, &req, &r)
}

// Infer runs a raw model on named tensors (codec.Tensor: every element type; a string
// tensor's elements in its Strings, sent as an array of str, and so returned).
func (c *Client) Infer(ctx context.Context, req codec.Request) (*codec.InferReply, error) {
	var r codec.InferReply
	return &r, c.Do(ctx, subjects.OpInfer, &req, &r)
}

// Status returns the system's status as the answering gateway sees it.
func (c *Client) Status(ctx context.Context) (*codec.StatusReply, error) {
	var r codec.StatusReply
	return &r, c.Do(ctx, subjects.OpStatus, &codec.Request{}, &r)
}

// Health returns the answering gateway's health.
func (c *Client) Health(ctx context.Context) (*codec.HealthReply, error) {
	var r codec.HealthReply
	return &r, c.Do(ctx, subjects.OpHealth, &codec.Request{}, &r)
}

// Cancel cancels a request by id.
func (c *Client) Cancel(ctx context.Context, id string) (*codec.CancelReply, error) {
	var r codec.CancelReply
	return &r, c.do(ctx, subjects.OpCancel, &codec.Cancel{ID: id}, &r)
}

// Pause pauses (or, with action resume, resumes) a class on demand: its queued work waits
// until the pause ends on its own (for_ms, 1 s to 1 h) or is resumed.
func (c *Client) Pause(ctx context.Context, req *codec.PauseRequest) (*codec.PauseReply, error) {
	var r codec.PauseReply
	return &r, c.do(ctx, subjects.OpPause, req, &r)
}

// Reload asks the answering gateway to re-read its config file and apply what changed
// (pools, models, class chains) without a restart; the reply comes once the workers it
// started are ready. Operators only (ortbus.ops.reload).
func (c *Client) Reload(ctx context.Context) (*codec.ReloadReply, error) {
	var r codec.ReloadReply
	return &r, c.ops(ctx, subjects.OpsReload, &codec.ModelControl{}, &r)
}

// Model loads, unloads or reloads one model at run time (ortbus.ops.model: operators
// only); the reply comes once the workers it started are ready.
func (c *Client) Model(ctx context.Context, mc *codec.ModelControl) (*codec.ReloadReply, error) {
	var r codec.ReloadReply
	return &r, c.ops(ctx, subjects.OpsModel, mc, &r)
}

// ops sends req to an operators' subject and decodes the reply into out.
func (c *Client) ops(ctx context.Context, subj string, req, out any) error {
	data, err := codec.Marshal(req)
	if err != nil {
		return err
	}
	msg, err := c.nc.RequestWithContext(ctx, subj, data)
	if errors.Is(err, nats.ErrNoResponders) {
		return codec.Errorf(codec.CodeNoWorker, "no ortbus gateway is answering %s", subj)
	} else if err != nil {
		return err
	}
	return Decode(msg, out)
}

// Do sends req to ortbus.v1.<op> and decodes the reply into out. It fills in the
// request's id, class, pool and timeout (from ctx's deadline) when they are empty.
func (c *Client) Do(ctx context.Context, op string, req *codec.Request, out any) error {
	if req.ID == "" {
		req.ID = nuid.Next()
	}
	if req.Class == "" {
		req.Class = c.Class
	}
	if req.Pool == "" {
		req.Pool = c.Pool
	}
	if dl, ok := ctx.Deadline(); ok && req.TimeoutMS == 0 {
		req.TimeoutMS = max(1, time.Until(dl).Milliseconds())
	}
	err := c.do(ctx, op, req, out)
	if ctx.Err() != nil && errors.Is(err, ctx.Err()) {
		// Tell the system to drop or stop it; the caller is no longer waiting.
		// Sent with a reply subject of this connection's own inbox: the gateway honours a
		// cancel only from the connection that sent the request.
		if b, merr := codec.Marshal(&codec.Cancel{ID: req.ID}); merr == nil {
			c.nc.PublishRequest(subjects.APIPrefix+"."+subjects.OpCancel, c.nc.NewRespInbox(), b)
		}
	}
	return err
}

func (c *Client) do(ctx context.Context, op string, req any, out any) error {
	subj, err := subjects.API(op)
	if err != nil {
		return err
	}
	data, err := codec.Marshal(req)
	if err != nil {
		return err
	}
	var msg *nats.Msg
	if c.Failover && subjects.IsWork(op) {
		msg, err = c.requestFailover(ctx, subj, data)
	} else {
		m := &nats.Msg{Subject: subj, Data: data}
		setTrace(ctx, m) // trace.go
		msg, err = c.nc.RequestMsgWithContext(ctx, m)
	}
	if err != nil {
		if errors.Is(err, nats.ErrNoResponders) {
			return codec.Errorf(codec.CodeNoWorker, "no ortbus gateway is answering %s", subj)
		}
		return err
	}
	return Decode(msg, out)
}

// Decode reads a reply message: an error reply becomes a *codec.Error.
func Decode(msg *nats.Msg, out any) error {
	if e := reply.ErrorOf(msg); e != nil {
		return e
	}
	asJSON := msg.Header.Get(codec.HeaderContentType) == codec.ContentTypeJSON
	if r, ok := out.(*rawReply); ok {
		r.data, r.asJSON = msg.Data, asJSON
		return nil
	}
	return codec.Decode(msg.Data, out, asJSON)
}
