package subcmd

import (
	"context"
	"io"
	"log/slog"
	"testing"

	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/telemetryd/telemetryd/store"
)

// TestSubcommandStoresExportNothing: a subcommand's store registers no
// instrument with the process's global meter provider, which in the
// service's tests is a running service's (whose blocked-tables gauge
// it would overwrite with its own zero).
func TestSubcommandStoresExportNothing(t *testing.T) {
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	prev := otel.GetMeterProvider()
	otel.SetMeterProvider(mp)
	t.Cleanup(func() { otel.SetMeterProvider(prev) })

	st, err := store.Open(context.Background(), t.TempDir(), StoreOptions(slog.New(slog.NewTextHandler(io.Discard, nil))))
	require.NoError(t, err)
	defer st.Close()
	var rm metricdata.ResourceMetrics
	require.NoError(t, reader.Collect(context.Background(), &rm))
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			t.Errorf("the subcommand's store exported %s (scope %s)", m.Name, sm.Scope.Name)
		}
	}
}
