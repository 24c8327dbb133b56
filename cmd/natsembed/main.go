// Command natsembed runs the ortbus NATS server: nats-server/v2 embedded, with
// nats-server's own flags (-a, -p, -m, -n, -js, -sd, -c, --cluster, --cluster_name,
// --routes, …) and one difference: listeners bind 127.0.0.1 unless a host is given.
//
// When the server accepts connections it prints one line of JSON to stdout (a codec.Event),
//
//	{"event":"ready","nats_url":"nats://127.0.0.1:4222","cluster":"127.0.0.1:6222","monitor":"127.0.0.1:8222"}
//
// ("cluster" only when clustering, "monitor" only with -m), so a script or a test started
// with -p -1 learns the ports that were picked. Logs go to stderr (or to -l FILE).
// SIGTERM or SIGINT shuts the server down cleanly and exits 0.
//
// natsembed -check [flags] validates the flags and the -c config file and exits, 0 when
// they are valid, without starting anything; deploy configs are checked with it.
package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"

	"github.com/ortbus/ortbus/codec"
	"github.com/ortbus/ortbus/natsd"
)

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

// run is the whole program. It returns the exit status: 0 ok (also after -h, -v, or a
// signal), 1 the server failed (or -check found the options invalid), 2 a bad flag or an
// unreadable or invalid config file.
func run(args []string, stdout, stderr io.Writer) int {
	var check bool
	register := func(fs *flag.FlagSet) {
		fs.BoolVar(&check, "check", false, "validate the flags and the -c config file, then exit (0 when valid) without starting")
	}
	opts, err := natsd.ParseArgsWith(args, register)
	switch {
	case errors.Is(err, natsd.ErrHelp):
		fmt.Fprintln(stdout, "usage: natsembed [-check] [nats-server flags]")
		natsd.PrintUsage(stdout, register)
		return 0
	case errors.Is(err, natsd.ErrVersion):
		fmt.Fprintf(stdout, "natsembed (%s)\n", natsd.Version())
		return 0
	case err != nil:
		fmt.Fprintf(stderr, "natsembed: %v\n", err)
		return 2
	}

	if check || opts.CheckConfig { // -check, or nats-server's own -t
		if err := natsd.Check(opts); err != nil {
			fmt.Fprintf(stderr, "natsembed: %v\n", err)
			return 1
		}
		fmt.Fprintln(stderr, "natsembed: configuration is valid")
		return 0
	}

	// Listen for signals before starting so that one arriving during start-up is not lost.
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM)
	defer signal.Stop(sigs)

	srv, err := natsd.Start(opts, natsd.WithServerLogging())
	if err != nil {
		fmt.Fprintf(stderr, "natsembed: %v\n", err)
		return 1
	}
	line := codec.Event{Event: codec.EventReady, NATSURL: srv.ClientURL(), Cluster: srv.ClusterAddr(), Monitor: srv.MonitorAddr()}.Line()
	if _, err := stdout.Write(line); err != nil {
		srv.Shutdown()
		fmt.Fprintf(stderr, "natsembed: writing ready line: %v\n", err)
		return 1
	}

	select {
	case sig := <-sigs:
		fmt.Fprintf(stderr, "natsembed: %v: shutting down\n", sig)
		srv.Shutdown()
		return 0
	case <-srv.Fatal():
		fmt.Fprintf(stderr, "natsembed: fatal: %v\n", srv.Err())
		srv.Shutdown()
		return 1
	}
}
