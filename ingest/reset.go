package ingest

import (
	"context"
	"errors"
	"fmt"

	"github.com/nats-io/nats.go/jetstream"
)

// ResetConsumer deletes the durable consumer of cfg (Stream, Consumer;
// defaults applied) so that the next Ingester creates it again at the
// positions its Positions hold. A store restored from a backup needs
// it: a consumer that outlived the restore has acknowledged messages
// past the backup's positions, which the restored store lacks. It
// reports whether there was a consumer to delete; a missing stream or
// consumer is no error.
func ResetConsumer(ctx context.Context, js jetstream.JetStream, cfg Config) (bool, error) {
	cfg = cfg.withDefaults()
	err := js.DeleteConsumer(ctx, cfg.Stream, cfg.Consumer)
	switch {
	case err == nil:
		return true, nil
	case errors.Is(err, jetstream.ErrConsumerNotFound), errors.Is(err, jetstream.ErrStreamNotFound):
		return false, nil
	}
	return false, fmt.Errorf("delete consumer %s: %w", cfg.Consumer, err)
}
