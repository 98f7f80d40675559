"""The Kafka wire protocol front door: one listener per broker (`SocketServer`), the codec
(`codec`, on kio's classes generated from Kafka's message schemas) and the request handlers
(`KafkaApis`) that turn protocol requests into calls on the broker's actors."""
