"""The composed memory: TieredChatMessageHistory over the archive and the tiers."""
