package main

import (
	"log/slog"
	"regexp"
	"strings"
)

// clientLine matches the embedded server's log lines about one client
// connection: "127.0.0.1:46212 - cid:22 - ..." (NATS) or
// "127.0.0.1:46212 - mid:20 - ..." (MQTT).
var clientLine = regexp.MustCompile(`^\S+ - [a-z]{3}:\d+ - `)

// mqtt5Hint is added to the server's line about an MQTT client that
// asked for another protocol version (most often MQTT 5).
const mqtt5Hint = "; this listener speaks MQTT 3.1.1 (protocol level 4): set the client to MQTT 3.1.1"

// classifyNATSError says how to log an error line of the embedded
// server. A line about one client is that client's mistake (a bad
// login, an MQTT version the server does not speak, a malformed
// protocol line), not the service's: it is logged at WARN. A refused
// login is reported, counted and sampled where it is refused (the
// auth callout's deniedReporter), so the server's own lines about it
// are dropped (log false) and each refusal is logged once.
func classifyNATSError(msg string) (level slog.Level, line string, log bool) {
	if !clientLine.MatchString(msg) {
		return slog.LevelError, msg, true
	}
	if strings.Contains(msg, "authentication error") {
		return 0, "", false
	}
	if strings.Contains(msg, "unacceptable protocol version") {
		msg += mqtt5Hint
	}
	return slog.LevelWarn, msg, true
}
