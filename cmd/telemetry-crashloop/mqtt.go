package main

import (
	"errors"
	"fmt"
	"time"

	mqtt "github.com/eclipse/paho.mqtt.golang"
)

// mqttClients is how many MQTT connections share the publishing.
const mqttClients = 8

var errMQTTNotConnected = errors.New("mqtt client not connected")

// mqttSender publishes the crash loop's messages as MQTT QoS 1
// PUBLISHes on telemetry/<device>; a message counts as acked only once
// its PUBACK arrived. Clients reconnect on their own after a kill; a
// publish that lost its connection fails and is sent again (its
// readings carry their timestamps, so a second copy merges into the
// same readings).
type mqttSender struct {
	pub     *publisher
	clients []mqtt.Client
}

// newMQTTSender connects mqttClients clients to addr, logging in with
// user and password unless user is empty.
func newMQTTSender(p *publisher, addr, user, password string) (*mqttSender, error) {
	s := &mqttSender{pub: p}
	for i := range mqttClients {
		opts := mqtt.NewClientOptions().
			AddBroker("tcp://" + addr).
			SetClientID(fmt.Sprintf("crashloop-%d", i)).
			SetProtocolVersion(4).
			SetCleanSession(true).
			SetAutoReconnect(true).
			SetConnectRetry(true).
			SetConnectRetryInterval(100 * time.Millisecond).
			SetMaxReconnectInterval(200 * time.Millisecond).
			SetWriteTimeout(5 * time.Second)
		if user != "" {
			opts.SetUsername(user).SetPassword(password)
		}
		c := mqtt.NewClient(opts)
		tok := c.Connect()
		if !tok.WaitTimeout(30 * time.Second) {
			s.close()
			return nil, fmt.Errorf("mqtt connect %s: timed out", addr)
		}
		if err := tok.Error(); err != nil {
			s.close()
			return nil, fmt.Errorf("mqtt connect %s: %w", addr, err)
		}
		s.clients = append(s.clients, c)
	}
	return s, nil
}

// send publishes message m with QoS 1.
func (s *mqttSender) send(m int) (<-chan error, error) {
	c := s.clients[m%len(s.clients)]
	if !c.IsConnectionOpen() {
		return nil, errMQTTNotConnected
	}
	msg := s.pub.message(m)
	tok := c.Publish("telemetry/"+s.pub.device(m), 1, false, msg.Data)
	done := make(chan error, 1)
	go func() {
		select {
		case <-tok.Done():
			done <- tok.Error()
		case <-time.After(30 * time.Second):
			done <- errors.New("no PUBACK within 30s")
		}
	}()
	return done, nil
}

func (s *mqttSender) close() {
	for _, c := range s.clients {
		c.Disconnect(250)
	}
}
