// Command gateway runs an ortbus gateway: the client API (NATS micro service `ortbus`,
// and HTTP), routing, scheduling, heartbeat tracking and the supervision of the config's
// local worker pools; with `[nats] embedded = true` it also runs the NATS server, so one
// command runs a whole machine. When ready it prints one JSON line on stdout (a
// codec.Event):
//
//	{"event":"ready","nats_url":"nats://127.0.0.1:PORT","http":"127.0.0.1:PORT"}
//
// SIGHUP re-reads the config file and applies what changed without a restart (pools and
// models; see gateway/reload.go); what cannot change so is refused and logged.
//
// Exit status: 0 after SIGTERM or SIGINT (a clean shutdown) or a passing -check; 1 a run
// failure, among them a NATS connection closed for good (gateway.Run); 2 a usage or
// config error.
package main

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"

	"github.com/ortbus/ortbus/codec"
	"github.com/ortbus/ortbus/config"
	"github.com/ortbus/ortbus/gateway"
	"github.com/ortbus/ortbus/internal/profile"
	"github.com/ortbus/ortbus/telemetry/export"
)

func main() { os.Exit(run()) }

func run() int {
	defer profile.Start("gateway")()
	cfgPath := flag.String("config", "", "ortbus config file (TOML)")
	natsListen := flag.String("nats-listen", "", "embedded NATS listen address (port 0 = any free port)")
	httpListen := flag.String("http-listen", "", "HTTP API address (port 0 = any free port; - = off)")
	workerBin := flag.String("worker", "", "ortworker executable (default: next to this binary)")
	check := flag.Bool("check", false, "validate the config and exit")
	flag.Parse()
	if *cfgPath == "" {
		fmt.Fprintln(os.Stderr, "usage: gateway -config FILE [-nats-listen ADDR] [-http-listen ADDR]")
		return 2
	}
	cfg, err := config.Load(*cfgPath)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	if *check {
		fmt.Println("config ok:", cfg.File)
		return 0
	}
	if *workerBin == "" {
		self, _ := os.Executable()
		*workerBin = filepath.Join(filepath.Dir(self), "ortworker")
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	// SIGHUP re-reads the config file and applies it without a restart (gateway/reload.go).
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	reload := make(chan struct{}, 1)
	go func() {
		for range hup {
			select {
			case reload <- struct{}{}:
			default: // one is waiting already
			}
		}
	}()
	log := slog.New(slog.NewTextHandler(os.Stderr, nil))
	defer export.Start("ortbus-gateway", log)() // spans, when the OTEL_* variables ask for them
	err = gateway.Run(ctx, gateway.Options{
		Config: cfg, NATSListen: *natsListen, HTTPListen: *httpListen, WorkerBin: *workerBin, Reload: reload,
		Logger: log,
		OnReady: func(r gateway.Ready) {
			os.Stdout.Write(codec.Event{Event: codec.EventReady, NATSURL: r.NATSURL, HTTP: r.HTTP}.Line())
		},
	})
	if err != nil {
		fmt.Fprintln(os.Stderr, "gateway:", err)
		return 1
	}
	return 0
}
