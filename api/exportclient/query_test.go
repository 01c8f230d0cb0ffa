package exportclient_test

import (
	"bytes"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/telemetryd/telemetryd/api"
	"github.com/telemetryd/telemetryd/api/exportclient"
	"github.com/telemetryd/telemetryd/buckets"
)

func TestQueryOptions(t *testing.T) {
	o, err := exportclient.Query{Match: `{fleet="East"}`, Prefix: "dev-", From: "2026-01-02T00:00:00Z", To: "1767398400000", Format: api.FormatCSV}.Options()
	require.NoError(t, err)
	assert.Equal(t, api.ExportOptions{Match: `{fleet="East"}`, Prefix: "dev-", Format: api.FormatCSV,
		From: buckets.MustTicks(time.Date(2026, 1, 2, 0, 0, 0, 0, time.UTC)),
		To:   buckets.MustTicks(time.Date(2026, 1, 3, 0, 0, 0, 0, time.UTC))}, o)

	o, err = exportclient.Query{}.Options()
	require.NoError(t, err)
	assert.Equal(t, api.ExportOptions{}, o, "empty: from the earliest reading, no end")

	_, err = exportclient.Query{From: "yesterday"}.Options()
	assert.ErrorContains(t, err, "from: ")
	_, err = exportclient.Query{To: "soon"}.Options()
	assert.ErrorContains(t, err, "to: ")
}

func TestProgress(t *testing.T) {
	var b bytes.Buffer
	p := exportclient.NewProgress(&b, "x: ", time.Hour)
	p.Update(10)
	assert.Empty(t, b.String(), "not before Every")
	p.Done(12)
	assert.True(t, strings.HasPrefix(b.String(), "x: 12 readings in "), b.String())

	b.Reset()
	p = exportclient.NewProgress(&b, "x: ", -time.Second)
	p.Update(10)
	assert.True(t, strings.HasPrefix(b.String(), "x: 10 readings, "), b.String())
}
