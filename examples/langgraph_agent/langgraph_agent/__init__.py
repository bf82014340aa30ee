"""A support agent as a LangGraph graph on agboss-sql workers: a model loop that calls
tools, a human approval (`interrupt()`) that any process answers, and a card charge made
once in the fence's transaction whatever worker dies."""
