package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os/exec"
	"strings"
	"time"
)

// network is a private network on one machine: a Linux bridge, and
// per member a network namespace joined to the bridge by a veth pair,
// with its own address in a /24. The harness itself talks to every
// member from the host through the bridge's address, which faults
// never cut: a partition is a set of iptables rules inside the
// members' namespaces, dropping what they exchange with each other.
//
// Names carry a random run ID, so runs side by side do not clash; the
// namespaces are named tf-<id>-<member>, the bridge tfb<id>.
type network struct {
	id      string
	bridge  string
	subnet  [3]byte // the /24: subnet.1 .. subnet.n are the members, subnet.254 the host
	members []string
	log     *slog.Logger
	made    []func() error // undo steps, run in reverse by close
}

// hostOctet is the bridge's (the host's) address in the subnet.
const hostOctet = 254

// errNoNamespaces is returned when this machine cannot make network
// namespaces (not root, or no CAP_NET_ADMIN).
var errNoNamespaces = errors.New("network namespaces unavailable")

// canMakeNamespaces reports why network namespaces cannot be made
// here, or nil.
func canMakeNamespaces(ctx context.Context) error {
	if _, err := exec.LookPath("ip"); err != nil {
		return fmt.Errorf("%w: no ip command (apt-get install iproute2)", errNoNamespaces)
	}
	if _, err := exec.LookPath("iptables"); err != nil {
		return fmt.Errorf("%w: no iptables command (apt-get install iptables)", errNoNamespaces)
	}
	name := "tf-probe-" + randomID()
	// Not cut short by ctx: an ip killed after it made the namespace
	// would leave it behind.
	out, err := exec.CommandContext(context.WithoutCancel(ctx), "ip", "netns", "add", name).CombinedOutput()
	if err != nil {
		return fmt.Errorf("%w: ip netns add: %v: %s (needs root)", errNoNamespaces, err, strings.TrimSpace(string(out)))
	}
	defer func() { _ = exec.Command("ip", "netns", "del", name).Run() }()
	// The network needs a bridge and veth pairs too (a kernel or
	// container may lack either): made inside the probe namespace, they
	// go with it.
	for _, step := range [][]string{
		{"link", "add", "tfprobe-br", "type", "bridge"},
		{"link", "add", "tfprobe-a", "type", "veth", "peer", "name", "tfprobe-b"},
		{"link", "set", "tfprobe-a", "master", "tfprobe-br"},
	} {
		args := append([]string{"-n", name}, step...)
		if out, err := exec.CommandContext(context.WithoutCancel(ctx), "ip", args...).CombinedOutput(); err != nil {
			return fmt.Errorf("%w: ip %s: %v: %s", errNoNamespaces, strings.Join(args, " "), err, strings.TrimSpace(string(out)))
		}
	}
	return ctx.Err()
}

func randomID() string {
	b := make([]byte, 3)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// newNetwork makes the bridge and one namespace per member. On error,
// ctx's end included, it undoes what it made. ctx is checked between
// steps, never passed to a step: an ip command killed half-way may have
// made what it was asked to and not said so, and its undo would be
// missing.
func newNetwork(ctx context.Context, members []string, log *slog.Logger) (n *network, err error) {
	n = &network{id: randomID(), members: members, log: log}
	n.bridge = "tfb" + n.id
	if n.subnet, err = freeSubnet(); err != nil {
		return nil, err
	}
	defer func() {
		if err != nil {
			n.close()
		}
	}()
	if err := n.ip(ctx, "link", "add", n.bridge, "type", "bridge"); err != nil {
		return n, err
	}
	n.undo(func() error { return run(context.Background(), "ip", "link", "del", n.bridge) })
	if err := n.ip(ctx, "addr", "add", n.addr(hostOctet)+"/24", "dev", n.bridge); err != nil {
		return n, err
	}
	if err := n.ip(ctx, "link", "set", n.bridge, "up"); err != nil {
		return n, err
	}
	for i := range members {
		ns, veth := n.ns(i), fmt.Sprintf("tfv%s%d", n.id, i)
		if err := n.ip(ctx, "netns", "add", ns); err != nil {
			return n, err
		}
		n.undo(func() error { return run(context.Background(), "ip", "netns", "del", ns) })
		// The peer moves into the namespace; deleting the namespace
		// deletes the pair.
		steps := [][]string{
			{"link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", ns},
			{"link", "set", veth, "master", n.bridge},
			{"link", "set", veth, "up"},
			{"-n", ns, "addr", "add", n.addr(i+1) + "/24", "dev", "eth0"},
			{"-n", ns, "link", "set", "eth0", "up"},
			{"-n", ns, "link", "set", "lo", "up"},
		}
		for _, s := range steps {
			if err := n.ip(ctx, s...); err != nil {
				return n, err
			}
		}
	}
	log.Info("network up", "bridge", n.bridge, "subnet", n.addr(0)+"/24", "namespaces", "tf-"+n.id+"-*")
	return n, nil
}

// freeSubnet picks a random 10.x.y.0/24 that no interface of the host
// is on.
func freeSubnet() ([3]byte, error) {
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		return [3]byte{}, err
	}
	for range 100 {
		b := make([]byte, 2)
		_, _ = rand.Read(b)
		s := [3]byte{10, 200 + b[0]%50, b[1]}
		_, cand, _ := net.ParseCIDR(fmt.Sprintf("%d.%d.%d.0/24", s[0], s[1], s[2]))
		clash := false
		for _, a := range addrs {
			if ipn, ok := a.(*net.IPNet); ok && (cand.Contains(ipn.IP) || ipn.Contains(cand.IP)) {
				clash = true
			}
		}
		if !clash {
			return s, nil
		}
	}
	return [3]byte{}, errors.New("no free 10.x.y.0/24 for the fault network")
}

func (n *network) undo(f func() error) { n.made = append(n.made, f) }

// addr is the address with last octet o in the network's subnet.
func (n *network) addr(o int) string {
	return fmt.Sprintf("%d.%d.%d.%d", n.subnet[0], n.subnet[1], n.subnet[2], o)
}

// ns is member i's namespace; memberAddr its address.
func (n *network) ns(i int) string         { return fmt.Sprintf("tf-%s-%d", n.id, i) }
func (n *network) memberAddr(i int) string { return n.addr(i + 1) }

// ip runs one step of making the network: to its end, ctx or not (see
// newNetwork), and only while ctx is live.
func (n *network) ip(ctx context.Context, args ...string) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	return run(context.WithoutCancel(ctx), "ip", args...)
}

// inNS runs a command inside member i's namespace.
func (n *network) inNS(ctx context.Context, i int, name string, args ...string) error {
	return run(ctx, "ip", append([]string{"netns", "exec", n.ns(i), name}, args...)...)
}

// command is a command to start inside member i's namespace. ip netns
// exec replaces itself with the command, so the process's PID is the
// command's (signals reach it).
func (n *network) command(i int, name string, args ...string) *exec.Cmd {
	return exec.Command("ip", append([]string{"netns", "exec", n.ns(i), name}, args...)...)
}

// cut makes members a and b unreachable to each other (both ways).
func (n *network) cut(ctx context.Context, a, b int) error {
	for _, p := range [][2]int{{a, b}, {b, a}} {
		peer := n.memberAddr(p[1])
		if err := n.inNS(ctx, p[0], "iptables", "-w", "-A", "INPUT", "-s", peer, "-j", "DROP"); err != nil {
			return err
		}
		if err := n.inNS(ctx, p[0], "iptables", "-w", "-A", "OUTPUT", "-d", peer, "-j", "DROP"); err != nil {
			return err
		}
	}
	return nil
}

// heal removes every partition rule and netem discipline.
func (n *network) heal(ctx context.Context) error {
	var errs []error
	for i := range n.members {
		errs = append(errs, n.inNS(ctx, i, "iptables", "-w", "-F"))
		_ = n.inNS(ctx, i, "tc", "qdisc", "del", "dev", "eth0", "root") // none set is fine
	}
	return errors.Join(errs...)
}

// hasNetem reports whether this kernel has the netem queueing
// discipline (some VM kernels are built without it).
func (n *network) hasNetem(ctx context.Context) bool {
	if err := n.inNS(ctx, 0, "tc", "qdisc", "add", "dev", "lo", "root", "netem", "delay", "1ms"); err != nil {
		return false
	}
	_ = n.inNS(ctx, 0, "tc", "qdisc", "del", "dev", "lo", "root")
	return true
}

// slowLink is what replaces netem where the kernel lacks it: a token
// bucket of rate on member i's link, whose queue delays packets by up
// to latency and drops what does not fit, and iptables dropping a
// random share loss (0 to 1) of the packets it receives and sends.
func (n *network) slowLink(ctx context.Context, i int, rate, latency string, loss float64) error {
	if err := n.inNS(ctx, i, "tc", "qdisc", "replace", "dev", "eth0", "root", "tbf", "rate", rate, "burst", "32kbit", "latency", latency); err != nil {
		return err
	}
	for _, chain := range []string{"INPUT", "OUTPUT"} {
		if err := n.inNS(ctx, i, "iptables", "-w", "-A", chain, "-m", "statistic", "--mode", "random",
			"--probability", fmt.Sprintf("%.3f", loss), "-j", "DROP"); err != nil {
			return err
		}
	}
	return nil
}

// netem sets a netem discipline on member i's link (e.g. "delay",
// "200ms", "50ms", "loss", "5%").
func (n *network) netem(ctx context.Context, i int, args ...string) error {
	return n.inNS(ctx, i, "tc", append([]string{"qdisc", "replace", "dev", "eth0", "root", "netem"}, args...)...)
}

// close removes the namespaces and the bridge. The processes inside
// must be gone first (runs stop them before).
func (n *network) close() error {
	var errs []error
	for i := len(n.made) - 1; i >= 0; i-- {
		if err := n.made[i](); err != nil {
			errs = append(errs, err)
		}
	}
	n.made = nil
	if len(errs) > 0 {
		n.log.Error("network teardown incomplete", "bridge", n.bridge, "err", errors.Join(errs...))
	}
	return errors.Join(errs...)
}

// run runs a command and returns its output in the error when it fails.
func run(ctx context.Context, name string, args ...string) error {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, name, args...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("%s %s: %w: %s", name, strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return nil
}
