// Package authcli is `telemetryd auth`: it edits the auth file, adding
// devices and tokens with new random secrets (printed once, stored as
// their SHA-256), revoking them and listing them.
package authcli

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"
	"text/tabwriter"

	"github.com/telemetryd/telemetryd/api/auth"
	"github.com/telemetryd/telemetryd/buckets"
)

const authUsage = `usage:
  telemetryd auth add-device ID [-publish-as ID,...|*] [-replace]  new device (or gateway) secret: NATS/MQTT password
  telemetryd auth add-token NAME -scopes read,write,admin,metrics [-devices PATTERN,...] [-replace]
  telemetryd auth revoke NAME|ID                            remove a token or a device
  telemetryd auth list                                      devices and tokens, never secrets
Every command takes -auth-file FILE (or TELEMETRY_AUTH_FILE). A new secret
is printed once; the file keeps only its SHA-256. A running telemetryd
picks the change up within seconds (or at once on SIGHUP).
`

// Run is `telemetryd auth ARGS...`; it returns the exit status.
func Run(args []string, getenv func(string) string, stdout, stderr io.Writer) int {
	if len(args) == 0 || args[0] == "-h" || args[0] == "-help" || args[0] == "--help" {
		fmt.Fprint(stderr, authUsage)
		if len(args) == 0 {
			return 2
		}
		return 0
	}
	cmd := args[0]
	fs := FlagSet(stderr)
	file, scopes := fs.Lookup("auth-file").Value, fs.Lookup("scopes").Value
	devices, replace := fs.Lookup("devices").Value, fs.Lookup("replace").Value.(flag.Getter)
	if err := file.Set(getenv("TELEMETRY_AUTH_FILE")); err != nil {
		return 2
	}
	pos, err := parseInterleaved(fs, args[1:])
	if err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		fmt.Fprintln(stderr, "telemetryd auth:", err)
		return 2
	}
	if file.String() == "" {
		fmt.Fprintln(stderr, "telemetryd auth: -auth-file (or TELEMETRY_AUTH_FILE) is required")
		return 2
	}
	want := map[string]int{"add-device": 1, "add-token": 1, "revoke": 1, "list": 0}
	n, known := want[cmd]
	if !known {
		fmt.Fprintf(stderr, "telemetryd auth: unknown command %q\n%s", cmd, authUsage)
		return 2
	}
	if len(pos) != n {
		fmt.Fprintf(stderr, "telemetryd auth %s: want %d argument(s), got %q\n%s", cmd, n, pos, authUsage)
		return 2
	}
	f, err := loadOrEmpty(file.String())
	if err != nil {
		fmt.Fprintln(stderr, "telemetryd auth:", err)
		return 1
	}
	var secret string
	switch cmd {
	case "list":
		listAuth(stdout, f)
		return 0
	case "add-device":
		secret, err = addDevice(f, pos[0], splitList(fs.Lookup("publish-as").Value.String()), replace.Get().(bool))
	case "add-token":
		secret, err = addToken(f, pos[0], scopes.String(), devices.String(), replace.Get().(bool))
	case "revoke":
		err = revoke(f, pos[0])
	}
	if err == nil {
		err = auth.Save(file.String(), f)
	}
	if err != nil {
		fmt.Fprintf(stderr, "telemetryd auth %s: %v\n", cmd, err)
		return 1
	}
	if secret != "" {
		fmt.Fprintln(stdout, secret)
		fmt.Fprintf(stderr, "the secret of %s is printed above, once; %s keeps only its SHA-256\n", pos[0], file)
	}
	return 0
}

// FlagSet is the flag set of the auth subcommands.
func FlagSet(out io.Writer) *flag.FlagSet {
	fs := flag.NewFlagSet("telemetryd auth", flag.ContinueOnError)
	fs.SetOutput(out)
	fs.String("auth-file", "", "the auth file to edit (created when missing; TELEMETRY_AUTH_FILE)")
	fs.String("scopes", "", "add-token: comma-separated scopes: read, write, admin, metrics")
	fs.String("devices", "", "add-token: comma-separated device patterns (shell globs); empty: every device")
	fs.String("publish-as", "", "add-device: a gateway's credential: comma-separated device IDs it may also publish for, or * for every device")
	fs.Bool("replace", false, "add-device, add-token: replace an existing entry's secret (rotation)")
	fs.Usage = func() { fmt.Fprint(out, authUsage); fs.PrintDefaults() }
	return fs
}

// parseInterleaved parses flags given before, between or after the
// positional arguments.
func parseInterleaved(fs *flag.FlagSet, args []string) ([]string, error) {
	var pos []string
	for {
		if err := fs.Parse(args); err != nil {
			return nil, err
		}
		args = fs.Args()
		if len(args) == 0 {
			return pos, nil
		}
		pos = append(pos, args[0])
		args = args[1:]
	}
}

func loadOrEmpty(path string) (*auth.File, error) {
	f, err := auth.Load(path)
	if errors.Is(err, os.ErrNotExist) {
		return &auth.File{}, nil
	}
	return f, err
}

func addDevice(f *auth.File, id string, publishAs []string, replace bool) (string, error) {
	if err := buckets.DeviceID(id).Validate(); err != nil {
		return "", err
	}
	secret, err := auth.NewSecret()
	if err != nil {
		return "", err
	}
	i := slices.IndexFunc(f.Devices, func(d auth.Device) bool { return d.ID == id })
	switch {
	case i >= 0 && !replace:
		return "", fmt.Errorf("device %q exists; add -replace to give it a new secret", id)
	case i >= 0:
		f.Devices[i].Secret = auth.HashSecret(secret)
		f.Devices[i].PublishAs = publishAs
	default:
		f.Devices = append(f.Devices, auth.Device{ID: id, Secret: auth.HashSecret(secret), PublishAs: publishAs})
	}
	return secret, f.Validate()
}

func splitList(s string) []string {
	var out []string
	for p := range strings.SplitSeq(s, ",") {
		if p = strings.TrimSpace(p); p != "" {
			out = append(out, p)
		}
	}
	return out
}

func addToken(f *auth.File, name, scopes, devices string, replace bool) (string, error) {
	t := auth.Token{Name: name, Devices: splitList(devices)}
	for _, s := range splitList(scopes) {
		t.Scopes = append(t.Scopes, auth.Scope(s))
	}
	if len(t.Scopes) == 0 {
		return "", fmt.Errorf("-scopes is required: any of %v", auth.Scopes)
	}
	secret, err := auth.NewSecret()
	if err != nil {
		return "", err
	}
	t.Secret = auth.HashSecret(secret)
	i := slices.IndexFunc(f.Tokens, func(x auth.Token) bool { return x.Name == name })
	switch {
	case i >= 0 && !replace:
		return "", fmt.Errorf("token %q exists; add -replace to replace it (its old secret stops working)", name)
	case i >= 0:
		f.Tokens[i] = t
	default:
		f.Tokens = append(f.Tokens, t)
	}
	return secret, f.Validate()
}

func revoke(f *auth.File, name string) error {
	nd, nt := len(f.Devices), len(f.Tokens)
	f.Devices = slices.DeleteFunc(f.Devices, func(d auth.Device) bool { return d.ID == name })
	f.Tokens = slices.DeleteFunc(f.Tokens, func(t auth.Token) bool { return t.Name == name })
	if nd == len(f.Devices) && nt == len(f.Tokens) {
		return fmt.Errorf("no device or token named %q", name)
	}
	return nil
}

func listAuth(w io.Writer, f *auth.File) {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "KIND\tNAME\tSCOPES\tDEVICES")
	for _, d := range f.Devices {
		fmt.Fprintf(tw, "device\t%s\tpublish\t%s\n", d.ID, strings.Join(append([]string{d.ID}, d.PublishAs...), ","))
	}
	for _, t := range f.Tokens {
		scopes := make([]string, len(t.Scopes))
		for i, s := range t.Scopes {
			scopes[i] = string(s)
		}
		devs := strings.Join(t.Devices, ",")
		if devs == "" {
			devs = "*"
		}
		fmt.Fprintf(tw, "token\t%s\t%s\t%s\n", t.Name, strings.Join(scopes, ","), devs)
	}
	_ = tw.Flush()
}
