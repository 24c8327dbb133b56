// Package natsd runs a NATS server (nats-server/v2) inside the current process, so that
// cmd/natsembed is a thin main and the gateway can run the bus in-process when its config
// says [nats] embedded.
//
// Flags are nats-server's own: ParseArgs hands them to server.ConfigureOptions, so an
// operator uses -a, -p, -m, -n, -js, -sd, -c, --cluster, --cluster_name, --routes (and
// every other nats-server flag) exactly as with nats-server, and a nats-server config file
// works unchanged.
//
// One deliberate difference from nats-server: every listener whose host is not given binds
// the loopback address 127.0.0.1, not 0.0.0.0. ortbus carries file paths on the bus and,
// by default, no authentication, so a bus reachable from the network would let any host
// on it submit work and read results. A single machine needs nothing more than loopback;
// a multi-host deployment says where to listen (-a, --cluster nats://10.0.0.5:6222 or the
// config file), which makes exposing the bus a decision rather than an accident.
//
// The embedded server never installs signal handlers and never exits the process: the
// program that embeds it owns both. A fatal error that nats-server would answer with
// os.Exit is turned into an error from Start, or into Server.Fatal after start.
package natsd
