// Command telemetryd is the telemetry ingestion service: it consumes
// device readings from NATS JetStream, stores them in Badger day
// tables, serves them over HTTP and drops expired days.
//
// Usage:
//
//	telemetryd [flags]                       run the service
//	telemetryd retention [-dry-run] [flags]  run retention once on a data dir
//	telemetryd auth add-device|add-token|revoke|list  edit the auth file
//	telemetryd check [flags]                 verify every stored block
//	telemetryd backup -to DIR [-url URL]     back up a data dir or a running service
//	telemetryd restore -from DIR -data-dir D rebuild a data dir from a backup
//
// Every flag may also be set as TELEMETRY_<NAME>; see -h. -version
// prints the version.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"

	"github.com/telemetryd/telemetryd/cmd/internal/authcli"
	"github.com/telemetryd/telemetryd/cmd/internal/backupcli"
	"github.com/telemetryd/telemetryd/cmd/internal/checkcli"
	"github.com/telemetryd/telemetryd/cmd/internal/cliflag"
	"github.com/telemetryd/telemetryd/cmd/internal/exportcli"
	"github.com/telemetryd/telemetryd/cmd/internal/repaircli"
	"github.com/telemetryd/telemetryd/cmd/internal/retentioncli"
	"github.com/telemetryd/telemetryd/cmd/internal/subcmd"
)

func main() {
	os.Exit(run(context.Background(), os.Args[1:], os.Getenv, os.Stdout, os.Stderr))
}

// run dispatches to a subcommand and returns the process exit code.
func run(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) int {
	if len(args) > 0 {
		sub := map[string]func(context.Context, []string, io.Writer, io.Writer, subcmd.Shared) int{
			"retention": retentioncli.Run, "check": checkcli.Run, "repair": repaircli.Run, "export": exportcli.Run,
			"backup": backupcli.RunBackup, "restore": backupcli.RunRestore,
		}[args[0]]
		if sub != nil {
			return sub(ctx, args[1:], stdout, stderr, shared(getenv, stderr))
		}
	}
	if len(args) > 0 && args[0] == "auth" {
		return authcli.Run(args[1:], getenv, stdout, stderr)
	}
	cfg := DefaultConfig()
	if err := cfg.parseFlags("telemetryd", args, getenv, stderr); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		if errors.Is(err, errVersion) {
			fmt.Fprintln(stdout, cliflag.Version("telemetryd"))
			return 0
		}
		fmt.Fprintln(stderr, "telemetryd:", err)
		return 2
	}
	log := newLogger(cfg, stderr)
	ctx, stop := signal.NotifyContext(ctx, syscall.SIGINT, syscall.SIGTERM)
	defer stop()

	m := NewMain(cfg, log, getenv)
	if err := m.Open(ctx); err != nil {
		log.Error("start failed", "err", err)
		closeCtx, cancel := context.WithTimeout(context.Background(), cfg.ShutdownTimeout)
		defer cancel()
		_ = m.Close(closeCtx)
		return 1
	}
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	defer signal.Stop(hup)
	for ctx.Err() == nil {
		select {
		case <-ctx.Done():
		case <-hup:
			m.ReloadRules(ctx)
		}
	}
	log.Info("shutting down", "timeout", cfg.ShutdownTimeout)
	closeCtx, cancel := context.WithTimeout(context.Background(), cfg.ShutdownTimeout)
	defer cancel()
	if err := m.Close(closeCtx); err != nil {
		log.Error("shutdown incomplete", "err", err)
		return 1
	}
	log.Info("stopped")
	return 0
}

// shared gives a subcommand the service's flags it uses, bound to one
// default configuration, with the environment from getenv and errors
// on stderr.
func shared(getenv func(string) string, stderr io.Writer) subcmd.Shared {
	cfg := DefaultConfig()
	return subcmd.Shared{
		Bind:  cfg.bindSubset,
		Usage: setUsage,
		Parse: func(fs *flag.FlagSet, args []string) (int, bool) {
			return parseSubcommand(fs, args, &cfg, getenv, stderr)
		},
		Values: func() subcmd.Values {
			return subcmd.Values{DataDir: cfg.DataDir, Retention: cfg.Retention, RetentionMaxBytes: cfg.RetentionMaxBytes,
				LogLevel: cfg.LogLevel, LogFormat: cfg.LogFormat}
		},
	}
}
