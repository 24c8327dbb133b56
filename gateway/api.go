package gateway

import (
	"encoding/json"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go/micro"

	"github.com/ortbus/ortbus/codec"
	"github.com/ortbus/ortbus/subjects"
)

// Version is the gateway's service version, shown by `nats micro info ortbus`.
const Version = "0.1.0"

// serveAPI registers the client API as the micro service `ortbus` in the queue group
// ortbus-gateway, one endpoint per op on ortbus.v1.<op>.
func (g *Gateway) serveAPI() error {
	svc, err := micro.AddService(g.nc, micro.Config{
		Name:        subjects.ServiceName,
		Version:     Version,
		Description: "ortbus: ONNX Runtime inference routed to resident workers",
		QueueGroup:  subjects.GatewayQueue,
		Metadata:    map[string]string{"gateway": g.id},
	})
	if err != nil {
		return err
	}
	g.svc = svc
	grp := svc.AddGroup(subjects.APIPrefix)
	for _, op := range subjects.Ops {
		op := op
		if err := grp.AddEndpoint(op, micro.HandlerFunc(func(r micro.Request) { g.handle(op, r) }),
			micro.WithEndpointPendingLimits(65536, -1)); err != nil {
			return err
		}
	}
	return nil
}

// handle serves one micro request. It never blocks: inference ops are queued and
// answered later from the dispatcher.
func (g *Gateway) handle(op string, r micro.Request) {
	asJSON := r.Headers().Get(codec.HeaderContentType) == codec.ContentTypeJSON
	reply := func(body []byte, e *codec.Error) {
		var opts []micro.RespondOpt
		if asJSON {
			opts = append(opts, micro.WithHeaders(micro.Headers{codec.HeaderContentType: {codec.ContentTypeJSON}}))
		}
		if e != nil {
			b, _ := codec.Encode(e, asJSON)
			r.Error(strconv.Itoa(e.Code.Status()), e.Message, b, opts...)
			return
		}
		r.Respond(body, opts...)
	}
	g.serveFrom(op, r.Data(), asJSON, r.Reply(), reply)
}

// serve dispatches one request of op from HTTP.
func (g *Gateway) serve(op string, data []byte, asJSON bool, reply Reply) {
	g.serveFrom(op, data, asJSON, "", reply)
}

// serveFrom dispatches one request of op; replyTo is its NATS reply subject, if any.
func (g *Gateway) serveFrom(op string, data []byte, asJSON bool, replyTo string, reply Reply) {
	encode := func(v any) {
		b, err := codec.Encode(v, asJSON)
		if err != nil {
			reply(nil, codec.Errorf(codec.CodeInternal, "%v", err))
			return
		}
		reply(b, nil)
	}
	switch op {
	case subjects.OpStatus:
		encode(g.status())
	case subjects.OpHealth:
		encode(g.health())
	case subjects.OpCancel:
		var c codec.Cancel
		if err := codec.Decode(data, &c, asJSON); err != nil || c.ID == "" {
			reply(nil, codec.Errorf(codec.CodeBadRequest, "cancel needs {id}"))
			return
		}
		encode(&codec.CancelReply{ID: c.ID, Found: g.cancelRequest(c.ID)})
	case subjects.OpTag, subjects.OpEmbed, subjects.OpCompare, subjects.OpDetect, subjects.OpSegment, subjects.OpInfer:
		g.submitFrom(op, data, asJSON, replyTo, reply)
	default:
		reply(nil, codec.Errorf(codec.CodeUnknownOp, "unknown op %q", op))
	}
}

// health is ok when every configured pool has a live worker.
func (g *Gateway) health() *codec.HealthReply {
	h := &codec.HealthReply{Status: "ok", Pools: len(g.cfg.Pools)}
	for _, pool := range g.cfg.PoolNames() {
		n := len(g.tracker.Live(pool))
		h.Workers += n
		if n == 0 {
			h.Status = "degraded"
		}
	}
	return h
}

// status is the whole system as this gateway sees it.
func (g *Gateway) status() *codec.StatusReply {
	st := &codec.StatusReply{Gateway: g.id, AllowedRoots: g.cfg.Security.AllowedRoots, SpoolDir: g.cfg.Security.SpoolDir, Devices: g.deviceStatus()}
	now := time.Now()
	for _, name := range g.cfg.PoolNames() {
		pc := g.cfg.Pools[name]
		ps := codec.PoolStatus{Name: name, EP: pc.EP, Device: pc.Device, Local: pc.IsLocal(), Classes: pc.Classes, Workers: pc.Workers, Live: len(g.tracker.Live(name))}
		ps.CrashLooping, ps.Error = g.supervisor.poolInfo(name)
		st.Pools = append(st.Pools, ps)
	}
	for _, w := range g.tracker.Workers() {
		ws := codec.WorkerStatus{Heartbeat: w.HB, HeartbeatAgeMS: now.Sub(w.Seen).Milliseconds()}
		if w.Dead {
			ws.State = "dead"
			ws.LastExit = w.Why
		}
		if ps, ok := g.supervisor.status(w.HB.Worker); ok {
			ws.Restarts = ps.restarts
			if ps.lastExit != "" {
				ws.LastExit = ps.lastExit
			}
		}
		st.Workers = append(st.Workers, ws)
	}
	g.mu.Lock()
	running := map[string]int{}
	for _, p := range g.inflight {
		if p.cancel != nil {
			running[p.class]++
		}
	}
	g.mu.Unlock()
	for _, name := range g.cfg.ClassNames() {
		cl := g.cfg.Classes[name]
		st.Classes = append(st.Classes, codec.ClassStatus{Name: name, Priority: cl.Priority, Queued: g.queues.Len(name), Running: running[name], Bound: cl.QueueBound, Chain: cl.Chain})
	}
	return st
}

// serveHTTP serves the same API as JSON over HTTP on a loopback address:
// POST /v1/<op>, GET /v1/status, GET /healthz, GET /readyz, GET /metrics.
func (g *Gateway) serveHTTP(override string) (string, error) {
	addr := g.cfg.Gateway.HTTPListen
	if override != "" {
		addr = override
	}
	if addr == "" || addr == "-" {
		return "", nil
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return "", err
	}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) { io.WriteString(w, "ok\n") })
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, _ *http.Request) {
		if h := g.health(); h.Workers == 0 {
			http.Error(w, "no live workers", http.StatusServiceUnavailable)
			return
		}
		io.WriteString(w, "ready\n")
	})
	mux.Handle("GET /metrics", promHandler(g.metrics.reg))
	mux.HandleFunc("GET /v1/status", func(w http.ResponseWriter, r *http.Request) { g.httpOp(w, r, subjects.OpStatus) })
	mux.HandleFunc("GET /v1/health", func(w http.ResponseWriter, r *http.Request) { g.httpOp(w, r, subjects.OpHealth) })
	mux.HandleFunc("POST /v1/{op}", func(w http.ResponseWriter, r *http.Request) { g.httpOp(w, r, r.PathValue("op")) })
	g.http = &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	go g.http.Serve(ln)
	return ln.Addr().String(), nil
}

func (g *Gateway) httpOp(w http.ResponseWriter, r *http.Request, op string) {
	body, err := io.ReadAll(io.LimitReader(r.Body, 64<<20))
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	if len(strings.TrimSpace(string(body))) == 0 {
		body = []byte("{}")
	}
	done := make(chan struct{})
	g.serve(op, body, true, func(b []byte, e *codec.Error) {
		defer close(done)
		w.Header().Set(codec.HeaderContentType, codec.ContentTypeJSON)
		if e != nil {
			w.WriteHeader(e.Code.Status())
			json.NewEncoder(w).Encode(e)
			return
		}
		w.Write(b)
	})
	<-done
}
