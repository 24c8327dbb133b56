package natsd

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"sync"

	"github.com/nats-io/nats-server/v2/server"
)

// LoopbackHost is the host every listener binds when its host is not configured.
const LoopbackHost = "127.0.0.1"

var (
	// ErrHelp is returned by ParseArgs for -h/--help/--help_tls (or the word "help"):
	// the caller prints PrintUsage and exits 0.
	ErrHelp = flag.ErrHelp
	// ErrVersion is returned by ParseArgs for -v/--version (or the word "version"):
	// the caller prints Version and exits 0.
	ErrVersion = errors.New("version requested")
)

// parseMu serialises calls into server.ConfigureOptions, which writes the package-level
// server.FlagSnapshot (used by nats-server's config reload).
var parseMu sync.Mutex

// Version is the version of the embedded nats-server.
func Version() string { return "nats-server v" + server.VERSION }

// ParseArgs parses nats-server command-line flags (args excludes the program name) into
// server options, reading the config file named by -c if any. Hosts left unset default to
// loopback (see the package doc). It returns ErrHelp or ErrVersion when those were asked
// for, and a wrapped error for a bad flag or an unreadable or invalid config file.
func ParseArgs(args []string) (*server.Options, error) {
	return ParseArgsWith(args, nil)
}

// ParseArgsWith is ParseArgs for a program that adds flags of its own (natsembed's
// -check, say): register, if not nil, defines them on the same flag set before the
// nats-server flags, so both kinds mix freely on one command line. A name nats-server
// already uses makes register panic (flag redefined).
func ParseArgsWith(args []string, register func(fs *flag.FlagSet)) (*server.Options, error) {
	parseMu.Lock()
	defer parseMu.Unlock()

	// First pass: only syntax and a refusal of -sl/--signal, which in nats-server signals
	// another process and may call os.Exit; nothing here is an external nats-server.
	probe := newFlagSet(register)
	if err := probe.Parse(args); err != nil {
		return nil, fmt.Errorf("natsd: parsing nats-server flags: %w", err)
	}
	var signalFlag string
	probe.Visit(func(f *flag.Flag) {
		if f.Name == "sl" || f.Name == "signal" {
			signalFlag = f.Name
		}
	})
	if signalFlag != "" {
		return nil, fmt.Errorf("natsd: -%s is not supported: signal the embedding process instead", signalFlag)
	}
	configFile := probe.Lookup("c").Value.String() // -c and -config share one variable

	fs := flag.NewFlagSet("natsembed", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	if register != nil {
		register(fs)
	}
	var help, version bool
	opts, err := server.ConfigureOptions(fs, args,
		func() { version = true },
		func() { help = true },
		func() { help = true })
	switch {
	case err != nil && configFile != "":
		return nil, fmt.Errorf("natsd: parsing nats-server flags with config file %s: %w", configFile, err)
	case err != nil:
		return nil, fmt.Errorf("natsd: parsing nats-server flags: %w", err)
	case help:
		return nil, ErrHelp
	case version:
		return nil, ErrVersion
	case opts == nil:
		return nil, errors.New("natsd: parsing nats-server flags: no options produced")
	}
	applyLoopbackDefaults(opts)
	return opts, nil
}

// PrintUsage writes the accepted flags (nats-server's and those of register) to w.
func PrintUsage(w io.Writer, register func(fs *flag.FlagSet)) {
	parseMu.Lock()
	fs := newFlagSet(register)
	parseMu.Unlock()
	fmt.Fprintf(w, "Flags are nats-server's (%s); listeners bind %s unless a host is given.\n\n", Version(), LoopbackHost)
	fs.SetOutput(w)
	fs.PrintDefaults()
}

// newFlagSet returns a flag set with register's flags and every nats-server flag defined,
// by letting ConfigureOptions define them and stop at -h. parseMu must be held.
func newFlagSet(register func(fs *flag.FlagSet)) *flag.FlagSet {
	fs := flag.NewFlagSet("natsembed", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	if register != nil {
		register(fs)
	}
	noop := func() {}
	_, _ = server.ConfigureOptions(fs, []string{"-h"}, noop, noop, noop)
	return fs
}

// Check validates opts the way starting a server would (nats-server's own option
// validation: accounts, cluster, JetStream settings, TLS files) without listening or
// writing anything. It is what natsembed -check runs after ParseArgs.
func Check(opts *server.Options) error {
	if opts == nil {
		return errors.New("natsd: no options")
	}
	o := opts.Clone()
	applyLoopbackDefaults(o)
	o.NoSigs = true
	ns, err := server.NewServer(o)
	if err != nil {
		return fmt.Errorf("natsd: invalid server options: %w", err)
	}
	ns.Shutdown()
	return nil
}

// applyLoopbackDefaults sets LoopbackHost on every enabled listener whose host is empty;
// nats-server itself would bind 0.0.0.0 there. The monitoring listener follows the client
// host (nats-server's rule), so it is covered by the first line.
func applyLoopbackDefaults(opts *server.Options) {
	if opts.Host == "" {
		opts.Host = LoopbackHost
	}
	if (opts.Cluster.Port != 0 || opts.Cluster.ListenStr != "") && opts.Cluster.Host == "" {
		opts.Cluster.Host = LoopbackHost
	}
	if opts.Gateway.Port != 0 && opts.Gateway.Host == "" {
		opts.Gateway.Host = LoopbackHost
	}
	if opts.LeafNode.Port != 0 && opts.LeafNode.Host == "" {
		opts.LeafNode.Host = LoopbackHost
	}
	if opts.Websocket.Port != 0 && opts.Websocket.Host == "" {
		opts.Websocket.Host = LoopbackHost
	}
	if opts.MQTT.Port != 0 && opts.MQTT.Host == "" {
		opts.MQTT.Host = LoopbackHost
	}
}
