package promapi

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/prometheus/prometheus/promql"
	"github.com/prometheus/prometheus/promql/parser"
)

// Limits that keep one query's parse and evaluation short enough for
// its timeout to hold.
const (
	// MaxNesting is the deepest nesting of parentheses, brackets and
	// braces a query may have. It is checked by one linear scan before
	// the Prometheus parser sees the query: the parser's time grows
	// faster than the depth (100,000 levels took it 30 s).
	MaxNesting = 256
	// subqueryStep is the step of a subquery that gives none
	// (EngineOpts.NoStepSubqueryIntervalFn).
	subqueryStep = time.Minute
)

// checkNesting returns an error naming MaxNesting when q nests
// parentheses, brackets and braces deeper than it. Strings and comments
// do not count; unbalanced closers are left to the parser.
func checkNesting(q string) error {
	depth := 0
	for i := 0; i < len(q); i++ {
		switch c := q[i]; c {
		case '"', '\'', '`':
			for i++; i < len(q) && q[i] != c; i++ {
				if q[i] == '\\' && c != '`' {
					i++
				}
			}
		case '#':
			for i < len(q) && q[i] != '\n' {
				i++
			}
		case '(', '[', '{':
			if depth++; depth > MaxNesting {
				return fmt.Errorf("nested deeper than %d levels of parentheses, brackets and braces (at byte %d); simplify the expression", MaxNesting, i)
			}
		case ')', ']', '}':
			depth--
		}
	}
	return nil
}

// checkSubqueries refuses a subquery with more than MaxPoints steps in
// its range: the engine evaluates a range function over a subquery at
// every step of the outer query without looking at the timeout, so the
// points per step must be bounded as the points per series are.
func checkSubqueries(expr parser.Expr) error {
	var err error
	parser.Inspect(expr, func(n parser.Node, _ []parser.Node) error {
		sq, ok := n.(*parser.SubqueryExpr)
		if !ok || err != nil {
			return nil
		}
		step := sq.Step
		if step <= 0 {
			step = subqueryStep
		}
		if pts := sq.Range / step; pts > MaxPoints {
			err = fmt.Errorf("subquery %s has %d points per step, more than %d; use a coarser subquery step or a shorter range",
				sq.String(), pts, MaxPoints)
		}
		return nil
	})
	return err
}

// outcome is what the parse and evaluation of one query came to.
type outcome struct {
	qry      promql.Query
	res      *promql.Result
	parseErr error
}

// run parses and evaluates a query (newQuery parses it) under ctx, the
// request's timeout: the depth check first, then the parse and the
// evaluation in a goroutine. When ctx ends first (the timeout passed or
// the client went away) the answer is written at once, 503 timeout or
// canceled, with Connection: close, and run waits for the goroutine to
// notice, so the query holds its share of the response budget and of
// the queries in flight until its work has stopped.
func (a *API) run(ctx context.Context, w http.ResponseWriter, r *http.Request, qs string, newQuery func() (promql.Query, error)) {
	if err := checkNesting(qs); err != nil {
		writeError(w, badData("query", "%v", err))
		return
	}
	done := make(chan outcome, 1)
	go func() {
		expr, err := a.parser.ParseExpr(qs)
		if err == nil {
			err = checkSubqueries(expr)
		}
		if err == nil && ctx.Err() == nil {
			var qry promql.Query
			if qry, err = newQuery(); err == nil {
				done <- outcome{qry: qry, res: qry.Exec(ctx)}
				return
			}
		}
		done <- outcome{parseErr: err}
	}()
	select {
	case o := <-done:
		a.answer(ctx, w, r, o)
	case <-ctx.Done():
		// The connection is busy until the work stops: the client must
		// not wait on it with its next request.
		w.Header().Set("Connection", "close")
		writeError(w, a.execError(r, ctx.Err()))
		if f, ok := w.(http.Flusher); ok {
			f.Flush()
		}
		if o := <-done; o.qry != nil {
			o.qry.Close()
		}
	}
}

// answer writes the outcome of a query that ended before its deadline.
func (a *API) answer(ctx context.Context, w http.ResponseWriter, r *http.Request, o outcome) {
	if o.qry == nil {
		if o.parseErr == nil { // the deadline passed as the parse ended
			o.parseErr = ctx.Err()
		}
		if errors.Is(o.parseErr, context.DeadlineExceeded) || errors.Is(o.parseErr, context.Canceled) {
			writeError(w, a.execError(r, o.parseErr))
			return
		}
		writeError(w, badData("query", "%v", o.parseErr))
		return
	}
	defer o.qry.Close()
	a.write(w, r, o.qry, o.res)
}
