package rules

import (
	"context"
	"time"

	"github.com/prometheus/prometheus/promql"
	"github.com/prometheus/prometheus/promql/parser"
)

// threshold is an alerting rule's expression of the form
// `<vector expression> <comparison> <number>` (or the number first),
// without bool: a filter of the vector by its values. The rules of a
// group evaluation that compare the same vector expression evaluate it
// once (operands) and filter it each by their own number; the answer
// is what the whole expression answers, labels included (a comparison
// without bool keeps the metric name, and changes no label).
type threshold struct {
	operand string // the vector expression, as the parser prints it
	op      parser.ItemType
	n       float64
	swapped bool // the number is on the left
	// anyKeeps are the thresholds of the group on the same operand,
	// this one among them: a sample none of them keeps is in no
	// rule's answer.
	anyKeeps []*threshold
}

// shareOperands sets anyKeeps of each of a group's thresholds.
func shareOperands(thrs []*threshold) {
	byOperand := map[string][]*threshold{}
	for _, t := range thrs {
		byOperand[t.operand] = append(byOperand[t.operand], t)
	}
	for _, t := range thrs {
		t.anyKeeps = byOperand[t.operand]
	}
}

// keepsAny reports whether any threshold on t's operand keeps v.
func (t *threshold) keepsAny(v float64) bool {
	for _, o := range t.anyKeeps {
		if o.keeps(v) {
			return true
		}
	}
	return len(t.anyKeeps) == 0 && t.keeps(v)
}

// thresholdOf returns expr's threshold, or nil when it is not one.
func thresholdOf(expr string) *threshold {
	e, err := parser.NewParser(parser.Options{}).ParseExpr(expr)
	if err != nil {
		return nil
	}
	b, ok := unparen(e).(*parser.BinaryExpr)
	if !ok || b.ReturnBool || !b.Op.IsComparisonOperator() {
		return nil
	}
	vec, num, swapped := b.LHS, b.RHS, false
	if n, ok := unparen(vec).(*parser.NumberLiteral); ok {
		vec, num, swapped = b.RHS, &parser.NumberLiteral{Val: n.Val}, true
	}
	n, ok := unparen(num).(*parser.NumberLiteral)
	if !ok || vec.Type() != parser.ValueTypeVector {
		return nil
	}
	return &threshold{operand: unparen(vec).String(), op: b.Op, n: n.Val, swapped: swapped}
}

func unparen(e parser.Expr) parser.Expr {
	for {
		p, ok := e.(*parser.ParenExpr)
		if !ok {
			return e
		}
		e = p.Expr
	}
}

// keeps reports whether a sample of value v passes the comparison.
func (t *threshold) keeps(v float64) bool {
	l, r := v, t.n
	if t.swapped {
		l, r = r, l
	}
	switch t.op {
	case parser.EQLC:
		return l == r
	case parser.NEQ:
		return l != r
	case parser.GTR:
		return l > r
	case parser.LSS:
		return l < r
	case parser.GTE:
		return l >= r
	case parser.LTE:
		return l <= r
	}
	return false
}

// operands keeps the vectors of one group evaluation's thresholds,
// evaluated once for every rule that compares them.
type operands map[string]promql.Vector

// query answers a threshold rule from the operand's vector, querying
// it the first time; ok is false when the vector holds a histogram (the
// rule is then queried whole).
//
// With keep set (Config.Keep), the operand is queried with a context
// that lets the engine leave out the samples no threshold on it keeps.
func (o operands) query(ctx context.Context, q QueryFunc, keep func(context.Context, func(float64) bool) context.Context, t *threshold, ts time.Time) (promql.Vector, bool, error) {
	vec, seen := o[t.operand]
	if !seen {
		qctx := ctx
		if keep != nil {
			qctx = keep(ctx, t.keepsAny)
		}
		var err error
		if vec, err = q(qctx, t.operand, ts); err != nil {
			return nil, true, err
		}
		o[t.operand] = vec
	}
	var out promql.Vector
	for _, s := range vec {
		if s.H != nil {
			return nil, false, nil
		}
		if t.keeps(s.F) {
			out = append(out, s)
		}
	}
	return out, true, nil
}
