// Command ortworker is one resident ortbus worker: it loads one pool's ONNX Runtime
// library, execution provider and models once, and serves infer.<pool>.<class> over NATS
// until SIGTERM, when it drains (every queued item answered) and exits 0.
//
// Once serving it prints one JSON line on stdout (a codec.Event),
//
//	{"event":"ready","worker":ID,"pool":POOL,"runtime":VERSION,"ep":EP,"pid":PID}
//
// On start-up failure of the pool (runtime_missing, provider_unavailable for the whole EP
// chain, overloaded for memory admission) it prints
//
//	{"event":"failed","worker":ID,"pool":POOL,"error":{"code":…,"message":…,"details":…}}
//
// instead, publishes a failed heartbeat if NATS is reachable, and exits 3. A model that
// fails to load does not stop it: that model is failed in its heartbeat and answered
// model_unavailable, and the worker serves the others (even with none left).
//
// Exit status: 0 drained after SIGTERM or SIGINT; 1 serving failed; 2 a usage or config
// error; 3 it could not start (the failed line); 4 its NATS connection was closed for good
// (a fatal server error, or an authorization error again on reconnecting: a rotated
// password) — restarting it (the gateway, systemd) connects afresh, rereading the
// credentials.
//
// Test-only: ORTBUS_FAULT_INJECT=1 makes a request whose path contains
// __ortbus_fault_segv__ (or __ortbus_fault_abort__) crash the process natively.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"runtime"
	"syscall"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nuid"

	"github.com/ortbus/ortbus/codec"
	"github.com/ortbus/ortbus/config"
	"github.com/ortbus/ortbus/images/vips"
	"github.com/ortbus/ortbus/internal/profile"
	"github.com/ortbus/ortbus/natsconn"
	"github.com/ortbus/ortbus/telemetry/export"
	"github.com/ortbus/ortbus/worker"
)

func main() { os.Exit(run()) }

// exitConnLost is the exit status after worker.ErrConnectionLost (see the package doc).
const exitConnLost = 4

func run() int {
	// Before anything allocates from C: libvips's per-item buffers reused, not faulted in
	// afresh, on huge pages (see vips.ReexecWithTunables and vips.TuneMalloc).
	reexecErr := vips.ReexecWithTunables()
	mallocNote := vips.TuneMalloc()
	defer profile.Start("ortworker")()
	cfgPath := flag.String("config", "", "ortbus config file (TOML)")
	pool := flag.String("pool", "", "the pool this worker serves")
	id := flag.String("id", "", "worker id (default: <pool>-<random>)")
	natsURL := flag.String("nats", "", "NATS URL (default: from the config)")
	flag.Parse()
	log := slog.New(slog.NewTextHandler(os.Stderr, nil))
	log.Info("allocator", "malloc", mallocNote)
	if reexecErr != nil {
		log.Warn("not started again with huge pages for malloc", "error", reexecErr)
	}
	if *cfgPath == "" || *pool == "" {
		fmt.Fprintln(os.Stderr, "usage: ortworker -config FILE -pool NAME [-id ID] [-nats URL]")
		return 2
	}
	cfg, err := config.Load(*cfgPath)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	if p, ok := cfg.Pools[*pool]; ok {
		goProcs(p)
	}
	url := *natsURL
	if url == "" {
		url = NATSURL(cfg)
	}
	if *id == "" {
		*id = *pool + "-" + nuid.Next()[16:]
	}
	w, err := worker.New(worker.Options{Config: cfg, Pool: *pool, ID: *id, Logger: log, OnReady: func(w *worker.Worker) {
		emit(codec.Event{Event: codec.EventReady, Worker: w.ID(), Pool: *pool, Runtime: w.Runtime().Version, EP: w.EP(), PID: os.Getpid()})
	}, OnLoading: func(model string) {
		// Written before the load starts: a native crash in it leaves this line with the
		// supervisor, which then skips the model.
		emit(codec.Event{Event: codec.EventLoading, Worker: *id, Pool: *pool, Model: model})
	}})
	if err != nil {
		e := codec.AsError(err)
		emit(codec.Event{Event: codec.EventFailed, Worker: *id, Pool: *pool, Error: e})
		log.Error("worker failed to start", "code", e.Code, "err", e.Message)
		// The pool's own NATS identity, as Serve would use (a URL's user:password is the
		// gateway's and must not log the worker in).
		opts, _ := natsconn.Options(cfg.WorkerNATS(*pool), "ortworker "+*id)
		if p, ok := cfg.Pools[*pool]; ok && p.HasCredentials() {
			url = natsconn.StripUserInfo(url)
		}
		if nc, cerr := nats.Connect(url, append(opts, nats.Timeout(500*time.Millisecond), nats.MaxReconnects(0))...); cerr == nil {
			worker.ReportFailure(nc, *pool, *id, e)
			nc.Close()
		}
		return 3
	}
	defer w.Close()
	defer export.Start("ortbus-worker", log)() // spans, when the OTEL_* variables ask for them
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	if err := w.Serve(ctx, url); err != nil {
		log.Error("worker stopped", "err", err)
		if errors.Is(err, worker.ErrConnectionLost) {
			return exitConnLost
		}
		return 1
	}
	return 0
}

// goProcs sets GOMAXPROCS to the pool's slots plus its decode goroutines (at least 1, at
// most the CPUs) unless the environment sets it (a pool's env table can). A worker's Go
// side decodes items beside the inference (worker/decode.go) and answers them, while ONNX
// Runtime's own threads do the compute: more Go processors only let the Go scheduler's
// idle spinning and work stealing take CPU from them. Measured (docs/BENCHMARKS.md,
// Throughput): PP-OCRv4 det through the system 0.76x in-process with the default (every
// CPU), 0.95x with one.
func goProcs(p *config.Pool) {
	if os.Getenv("GOMAXPROCS") != "" {
		return
	}
	cpus := runtime.NumCPU()
	runtime.GOMAXPROCS(max(1, min(p.Slots+p.DecodeWorkers(cpus), cpus)))
}

// NATSURL is the URL a worker uses from the config: nats.url, or the embedded server's
// listen address.
func NATSURL(c *config.Config) string {
	if c.NATS.URL != "" {
		return c.NATS.URL
	}
	return "nats://" + c.NATS.Listen
}

// emit prints an event line on stdout.
func emit(e codec.Event) { os.Stdout.Write(e.Line()) }
