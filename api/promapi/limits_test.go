package promapi

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
)

func TestCheckNesting(t *testing.T) {
	deep := func(n int, open, close string) string {
		return strings.Repeat(open, n) + "1" + strings.Repeat(close, n)
	}
	for name, tc := range map[string]struct {
		q  string
		ok bool
	}{
		"256 parentheses":          {deep(MaxNesting, "(", ")"), true},
		"257 parentheses":          {deep(MaxNesting+1, "(", ")"), false},
		"mixed kinds count":        {deep(MaxNesting/2, "(", ")")[:MaxNesting/2] + deep(MaxNesting/2+1, "sum(x{a=\"b\"}[5m:", "])"), false},
		"in a double-quoted label": {`x{a="` + strings.Repeat("(", 1000) + `"}`, true},
		"escaped quote in string":  {`x{a="\"` + strings.Repeat("(", 1000) + `"}`, true},
		"in a raw string":          {"x{a=`" + strings.Repeat("[", 1000) + "`}", true},
		"in a comment":             {"x # " + strings.Repeat("{", 1000) + "\n", true},
		"unbalanced closers":       {strings.Repeat(")", 1000), true},
	} {
		t.Run(name, func(t *testing.T) {
			err := checkNesting(tc.q)
			if tc.ok {
				assert.NoError(t, err)
				return
			}
			assert.ErrorContains(t, err, "nested deeper than 256 levels")
		})
	}
}
