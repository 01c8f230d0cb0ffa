package api_test

import (
	"net/http"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/telemetryd/telemetryd/api"
	"github.com/telemetryd/telemetryd/api/auth"
)

// nodeAPI is a node-to-node API (a fake at api.InternalAPI): the
// credential is "node-secret", the caller the token named in
// Telemetry-Caller; it answers with the name of the principal it was
// served with.
type nodeAPI struct{ tokens map[string]*auth.Principal }

func (n nodeAPI) Authorize(r *http.Request) (*auth.Principal, bool, error) {
	if r.Header.Get("Authorization") != "Bearer node-secret" {
		return nil, false, nil
	}
	return n.tokens[strings.TrimPrefix(r.Header.Get("Telemetry-Caller"), "token ")], true, nil
}

func (n nodeAPI) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	name := "open"
	if p := auth.FromContext(r.Context()); p != nil {
		name = p.Name
	}
	_, _ = w.Write([]byte(name))
}

// TestInternalTakesOnlyTheClusterCredential: the node-to-node API needs
// the cluster credential (no token at all is 401, any API token 403),
// runs with the principal of the caller it names, and is never counted
// against a client rate limit, while the clients' requests are.
func TestInternalTakesOnlyTheClusterCredential(t *testing.T) {
	principals := map[string]*auth.Principal{"sim": auth.NewPrincipal("sim", []auth.Scope{auth.ScopeRead}, []string{"sim-*"})}
	env := newTestEnv(t, withAuth, func(c *api.Config) {
		c.Internal = nodeAPI{tokens: principals}
		c.RateLimit, c.RateBurst = 0.0001, 3
	})
	node := []string{"Authorization", "Bearer node-secret", "Telemetry-Caller", "token sim"}
	for i := range 20 {
		r := env.do(t, http.MethodPost, "/internal/v1/latest", node...)
		require.Equal(t, http.StatusOK, r.status, "node-to-node call %d: %s", i, r.body)
		assert.Equal(t, "sim", string(r.body), "the call runs with its caller's principal")
	}
	msg := requireError(t, env.do(t, http.MethodPost, "/internal/v1/latest"), http.StatusUnauthorized, "unauthenticated", "authorization")
	assert.Contains(t, msg, "needs the cluster credential")
	msg = requireError(t, env.do(t, http.MethodPost, "/internal/v1/latest", bearer(adminOnly)...), http.StatusForbidden, "permission_denied", "authorization")
	assert.Contains(t, msg, "token admin is not the cluster credential")
	// Refused attempts count against the address: its burst of 3 is spent.
	requireError(t, env.do(t, http.MethodPost, "/internal/v1/latest", bearer(readAll)...), http.StatusForbidden, "permission_denied", "authorization")
	requireError(t, env.do(t, http.MethodPost, "/internal/v1/latest", bearer(readAll)...), http.StatusTooManyRequests, "resource_exhausted", "request")
	for i := range 3 {
		require.Equal(t, http.StatusOK, env.do(t, http.MethodGet, "/v1/tables", bearer(readSim)...).status, "client request %d of its burst", i)
	}
	requireError(t, env.do(t, http.MethodGet, "/v1/tables", bearer(readSim)...), http.StatusTooManyRequests, "resource_exhausted", "")
	assert.Equal(t, http.StatusOK, env.do(t, http.MethodPost, "/internal/v1/latest", node...).status, "and the nodes still are not limited")
}
