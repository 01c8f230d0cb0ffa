package main

import (
	"fmt"
	"strings"
)

// The fleet questions of TSBS's IoT use case as PromQL (api/FLEET-QUERIES.md
// lists them with what each computes). The two services name things
// differently: telemetryd's series are {__name__="<measurement>.<field>",
// device="truck_7", <attributes>} (the bench starts it with
// -line-name-separator .), the peer's (through its InfluxDB
// endpoint) <measurement>_<field>{name="truck_7", <tags>}. Each question
// is written once against a dialect that spells both.

// promDialect spells selectors and the truck label of one service.
type promDialect struct {
	truck string // the label that names a truck
	dot   bool   // metric names are <measurement>.<field> (else <measurement>_<field>)
}

var (
	telemetrydDialect = promDialect{truck: "device"} // line protocol names as -line-name-separator _ (the default) makes them
	peerDialect       = promDialect{truck: "name"}
)

// sel is the selector of measurement.field with the extra matchers.
func (d promDialect) sel(measurement, field string, matchers ...string) string {
	if d.dot {
		return "{" + strings.Join(append([]string{fmt.Sprintf("__name__=%q", measurement+"."+field)}, matchers...), ",") + "}"
	}
	return measurement + "_" + field + "{" + strings.Join(matchers, ",") + "}"
}

// selRe is the selector of the fields of measurement matching the
// regexp alternatives fields (e.g. "latitude|longitude").
func (d promDialect) selRe(measurement, fields string, matchers ...string) string {
	sep := "_"
	if d.dot {
		sep = `\\.`
	}
	name := fmt.Sprintf(`__name__=~"%s%s(%s)"`, measurement, sep, fields)
	return "{" + strings.Join(append([]string{name}, matchers...), ",") + "}"
}

// fleetQuestion is one TSBS IoT question.
type fleetQuestion struct {
	Name  string
	Query func(d promDialect, fleet string) string
}

// fleetQuestions are the questions asked of the 6-hour file, evaluated
// at its newest time: "window" is the whole file.
func fleetQuestions(window string) []fleetQuestion {
	fl := func(fleet string) string { return fmt.Sprintf("fleet=%q", fleet) }
	return []fleetQuestion{
		{"last location per truck of a fleet", func(d promDialect, f string) string {
			return fmt.Sprintf("last_over_time(%s[%s])", d.selRe("readings", "latitude|longitude", fl(f)), window)
		}},
		{"low fuel (latest fuel_state <= 0.1) in a fleet", func(d promDialect, f string) string {
			return fmt.Sprintf("last_over_time(%s[%s]) <= 0.1", d.sel("diagnostics", "fuel_state", fl(f)), window)
		}},
		{"high load (latest current_load >= 0.9 load_capacity) in a fleet", func(d promDialect, f string) string {
			return fmt.Sprintf("last_over_time(%s[%s]) >= 0.9 * last_over_time(%s[%s])",
				d.sel("diagnostics", "current_load", fl(f)), window, d.sel("diagnostics", "load_capacity", fl(f)), window)
		}},
		{"stationary trucks (mean velocity < 1 over 10 min) in a fleet", func(d promDialect, f string) string {
			return fmt.Sprintf("avg_over_time(%s[10m]) < 1", d.sel("readings", "velocity", fl(f)))
		}},
		{"long driving sessions (> 22 of the last 24 ten-minute periods driving) in a fleet", func(d promDialect, f string) string {
			return fmt.Sprintf("count_over_time((avg_over_time(%s[10m]) > 1)[4h:10m]) > 22", d.sel("readings", "velocity", fl(f)))
		}},
		{"average load per fleet and model", func(d promDialect, _ string) string {
			return fmt.Sprintf("avg by (fleet, model) (avg_over_time(%s[%s]) / avg_over_time(%s[%s]))",
				d.sel("diagnostics", "current_load"), window, d.sel("diagnostics", "load_capacity"), window)
		}},
		{"daily activity per fleet and model (share of 10-minute periods with mean status < 1)", func(d promDialect, _ string) string {
			return fmt.Sprintf("count_over_time((avg by (fleet, model) (avg_over_time(%s[10m])) < 1)[1d:10m]) / 144",
				d.sel("diagnostics", "status"))
		}},
	}
}

// tsbsFleets are the fleets of TSBS's IoT data; the questions about one
// fleet go round them.
var tsbsFleets = []string{"East", "West", "North", "South"}
